"""BERT in Flax NNX, its task heads, its losses and Hugging Face import/export."""
