"""What a run may claim: the privacy report, the model card's privacy section, and the lineage of a starting model."""
