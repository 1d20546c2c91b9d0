"""The fine-tuning tasks' input modes: `privacy.mode` -> what the users release instead of
their text, and what that means for the service's model, loss and export.

    base.py         `InputMode` (what a mode does and what it needs), the capabilities a task
                    declares (`TOKENS`, `SENTENCE`, `ONE_SEQUENCE`), the shared folder writer of
                    the modes whose export is not a Hugging Face task model
    dchi_modes.py   Qu et al.'s dχ modes: none, token_rep, text_to_text, seq_rep
    ome.py          OME (Lyu et al. 2020): randomized bits of the frozen encoder's sentence vector
    texthide.py     TextHide (Huang et al. 2020): mixed, sign-masked sentence representations
    registry.py     the table of modes, by name: a new mode is a module here and one line there

Nothing here imports a task: a task declares its capabilities (`FineTuningTask.capabilities`),
a mode its needs (`InputMode.needs`), and `dpbert.tasks.finetuning.validate_common` matches
them.
"""
