"""What a run may claim: the privacy report (report), the model card's privacy section (card),
and the lineage of a starting model (lineage)."""
