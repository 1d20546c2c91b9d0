"""`python launch/finetune.py`: --help exits 0; each mistake of a new user is ONE line (exit
!= 0) and nothing is trained. One subprocess drives every case (`test_launchers.drive`); the
per-case settings live in small config files, since `--config.x=...` overrides need a real
command line each (see test_launchers)."""

from tests.dpbert.tasks import finetune_fixtures as fx
from tests.launch.test_launchers import drive, one_error_line, run_cli


def config_file(path, base: str, **fields) -> str:
    lines = [f"from configs import {base}", "", "", "def get_config():",
             f"    c = {base}.get_config()"]
    lines += [f"    c.{k} = {v!r}" for k, v in fields.items()]
    path.write_text("\n".join(lines + ["    return c", ""]))
    return f"--config={path}"


def test_finetune_launcher_help_and_one_line_errors(tmp_path):
    ckpt = fx.tiny_checkpoint(tmp_path / "ckpt")
    train, eval_ = fx.sentiment_tsvs(tmp_path / "data", n_train=40, n_eval=8)
    bad_label = tmp_path / "bad_label.tsv"
    bad_label.write_text("label\tsentence\n0\tgood film\n7\tbad film\n")
    ok = {"model.init_from_hf": str(ckpt), "data.train": str(train), "data.eval": str(eval_)}

    def cfg(name, base="finetune_classification", **fields):
        return config_file(tmp_path / f"{name}.py", base, **{**ok, **fields})

    w = f"--workdir={tmp_path / 'w'}"
    cases = {
        "help": ["--help"],
        "mode": [cfg("mode", **{"privacy.mode": "words"}), w],
        "eta": [cfg("eta", **{"privacy.mode": "text_to_text", "privacy.eta": 0.0}), w],
        "label": [cfg("label", **{"data.eval": str(bad_label)}), w],
        "missing": [cfg("missing", **{"data.eval": str(tmp_path / "nope.tsv")}), w],
        "ckpt": [cfg("ckpt", **{"model.init_from_hf": str(tmp_path / "data")}), w],
        "ghost": [cfg("ghost", **{"dp.enabled": True, "dp.clipping": "ghost_embedding",
                                  "privacy.mode": "seq_rep"}), w],
        "workdir": [cfg("workdir"), f"--workdir={train}"],
        "ner_mode": [config_file(tmp_path / "ner.py", "finetune_ner", **{
            "model.init_from_hf": str(ckpt), "privacy.mode": "seq_rep",
            "data.max_seq_length": 32}), w],
    }
    got = dict(zip(cases, drive("finetune.py", "finetune", list(cases.values()))))
    got["field"] = run_cli("finetune.py", "--config=configs/finetune_classification.py", w,
                           "--config.privacy.etaa=3")
    assert got["help"][0] == 0 and "results.json" in got["help"][1]
    expect = {
        "mode": "config.privacy.mode='words': must be one of",
        "eta": "privacy.eta must be a finite number > 0",
        "label": "bad_label.tsv:3:1: unknown label (1 character: digits)",
        "missing": "nope.tsv: file not found",
        "ckpt": "no config.json there",
        "ghost": "use dp.clipping='vmap'",
        "workdir": "is a file, not a folder",
        "ner_mode": "not available for the ner task",
        "field": "unknown config field 'etaa'",
    }
    for case, text in expect.items():
        line = one_error_line(got[case])
        assert line.startswith("finetune: error: ") and text in line, (case, line)
    checkpoints = tmp_path / "w" / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())
