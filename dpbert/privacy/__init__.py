"""Input-privacy mechanisms: dχ (pretraining and the users' release), OME, TextHide, and what an eavesdropper recovers."""
