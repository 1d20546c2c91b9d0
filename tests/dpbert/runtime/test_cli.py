"""dpbert/runtime/cli.py: what every launcher shares (one-line errors, a readable console)."""

import logging as std_logging
import os
import pathlib
import re
import sys

import tqdm
from absl import logging

from dpbert.runtime import cli


def test_one_line():
    nested = ("Traceback (most recent call last):\n  File \"configs/x.py\", line 3\n"
              "ValueError: configs/x.py: unknown config arg 'sise'\n")
    assert cli.one_line(nested) == "configs/x.py: unknown config arg 'sise'"
    assert cli.one_line("a\n\nb") == "a; b"


def test_unknown_field_keeps_the_hint():
    e = AttributeError('\'noise_multiplierr\'\nDid you mean "noise_multiplier" instead of '
                       '"noise_multiplierr"?')
    msg = cli._unknown_field_message(e, ["x", "--config.dp.noise_multiplierr=2"])
    assert msg.startswith("--config.dp.noise_multiplierr: unknown config field "
                          "'noise_multiplierr'; did you mean \"noise_multiplier\"")


def test_check_output_dir(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert "is a file" in cli.check_output_dir(str(a_file), "--out")
    assert "cannot be created" in cli.check_output_dir(str(a_file / "sub"), "--out")
    assert cli.check_output_dir(str(tmp_path / "new" / "deeper"), "--out") is None
    assert cli.check_output_dir("gs://bucket/run", "--workdir") is None
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert "is not empty" in cli.check_output_dir(str(tmp_path / "full"), "--out",
                                                  must_be_empty=True)
    ro = "/sys/dpbert_cli" if os.getuid() == 0 else str(_read_only(tmp_path) / "sub")
    assert "not writable" in cli.check_output_dir(ro, "--workdir")


def _read_only(tmp_path: pathlib.Path) -> pathlib.Path:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    return ro


def test_log_lines_and_progress_bars_use_separate_lines(capsys):
    """'tokenizing: 1536 docs [00:02, 676 docs/s]I1123 ... corpora.py] ...' on one line."""
    attached = logging.get_absl_handler() in std_logging.root.handlers
    logging.use_absl_handler()  # what app.run does; undone below for the other tests
    try:
        cli.setup_console()
        logging.warning("first line")  # absl's one-time "Logging before flag parsing" notice
        bar = tqdm.tqdm(total=10, file=sys.stderr, desc="tokenizing", mininterval=0)
        bar.update(3)
        logging.warning("a log line while the bar is on screen")
        bar.update(3)
        bar.close()
    finally:
        if not attached:
            std_logging.root.removeHandler(logging.get_absl_handler())
    err = capsys.readouterr().err
    (line,) = [piece for piece in re.split(r"[\r\n]", err) if "a log line" in piece]
    assert line.startswith("W") and "tokenizing" not in line, repr(err)
    assert "tokenizing" in err  # the bar is still drawn


def test_library_info_logs_are_dropped_warnings_kept():
    quiet = cli._QuietLibraries()
    rec = lambda name, level, path: std_logging.LogRecord(  # noqa: E731
        name, level, path, 1, "msg", None, None)
    tpu = rec("jax._src.xla_bridge", std_logging.INFO,
              "/site-packages/jax/_src/xla_bridge.py")  # "Unable to initialize backend 'tpu'"
    assert not quiet.filter(tpu)
    assert not quiet.filter(rec("absl", std_logging.INFO, "/site-packages/orbax/x.py"))
    assert quiet.filter(rec("jax._src.xla_bridge", std_logging.WARNING, "/jax/x.py"))
    assert quiet.filter(rec("absl", std_logging.INFO, "/repo/data_pipelines/corpora.py"))


def test_none_unsets_a_field_but_is_a_value_of_a_string_field():
    """`--config.privacy.mode=none` is the mode "none"; `--config.dp.noise_multiplier=None`
    (a float field, or a placeholder) unsets it."""
    from configs import finetune_classification
    config = finetune_classification.get_config()
    config.privacy.mode = "token_rep"
    cli._set_none("config", config, [("privacy.mode", "none"), ("dp.noise_multiplier", "None"),
                                     ("dp.target_epsilon", "none"),
                                     ("model.classifier_dropout", "none")])
    assert config.privacy.mode == "none"
    assert config.dp.noise_multiplier is None and config.dp.target_epsilon is None
    assert config.model.classifier_dropout is None
    try:
        cli._set_none("config", config, [("privacy.modee", "none")])
    except AttributeError as e:
        assert "modee" in str(e)
    else:
        raise AssertionError("an unknown field must be an error")


def test_degenerate_output_paths_are_refused(tmp_path, monkeypatch):
    """Issue 35: an empty path meant the current directory (finetune --workdir= wrote a whole
    workdir there); the current directory, a folder holding it, and an output that is, lies in
    or holds a source are refused by one helper, whatever spelling or symlink names them."""
    from data_pipelines import fileio

    here = tmp_path / "runs" / "here"
    here.mkdir(parents=True)
    src = tmp_path / "models" / "model"
    src.mkdir(parents=True)
    (tmp_path / "link").symlink_to(src)
    monkeypatch.chdir(here)
    check = cli.check_output_dir
    assert check("", "--workdir").startswith("--workdir=: is empty (an empty path would mean "
                                              "the current directory)")
    for spelling in (".", "./", str(here), "../here"):
        assert "is the current directory" in check(spelling, "--out"), spelling
    for spelling in ("..", str(tmp_path), "/"):
        assert "contains the current directory" in check(spelling, "--out"), spelling
    sources = [("--from_hf=model", str(src))]
    assert check(str(tmp_path / "link"), "--out", sources=sources) == (
        f"--out={tmp_path / 'link'}: is the source --from_hf=model itself; write to another "
        "folder")
    assert "is inside the source --from_hf=model" in check(str(src / "x"), "--out",
                                                           sources=sources)
    assert check(str(src / "x"), "--out", sources=sources, inside_sources_ok=True) is None
    assert "contains the source --from_hf=model" in fileio.path_problem(
        tmp_path / "models", sources=[("--from_hf=model", tmp_path / "link")])
    assert check(str(tmp_path / "new"), "--out", sources=sources) is None
    assert fileio.output_folder_problem(pathlib.Path(".")).startswith("is the current directory")
    assert check("gs://bucket/run", "--workdir", sources=sources) is None
    assert not os.listdir(here)


def test_fifos_and_empty_inputs_are_named(tmp_path):
    """A FIFO was 'not found' (it is not a regular file); an empty input path is refused."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert cli.check_input_path(str(fifo), "--corpus") == (
        f"--corpus={fifo}: is a named pipe (FIFO), not a regular file; write its content to a "
        "file first (it is read more than once)")
    assert cli.check_input_path("", "--embeddings") == "--embeddings= is empty; give a path"
    assert cli.check_input_path(str(tmp_path / "missing"), "--corpus") is None  # the reader says
    from configs import finetune_classification
    config = finetune_classification.get_config()
    assert cli.check_config_inputs(config) is None
    config.data.eval = str(fifo)
    assert cli.check_config_inputs(config).startswith(f"config.data.eval={fifo}: is a named pipe")


def test_a_config_field_given_twice_is_refused_naming_both_values():
    """Issue 35: `--config.dp.target_epsilon=None ... --config.dp.target_epsilon=1e-6` ran with
    no target (None overrides were applied after every other flag). A field given twice is
    refused whatever the order or the spelling."""
    twice = ("--config.dp.target_epsilon is given twice ({!r}, then {!r}); give each config "
             "field once (which one counts would depend on the order of the flags)")
    for args, values in (
            (["--config.dp.target_epsilon=None", "--config.dp.target_epsilon=1e-6"],
             ("None", "1e-6")),
            (["--config.dp.target_epsilon=1e-6", "--workdir=w", "--config.dp.target_epsilon",
              "none"], ("1e-6", "none")),
            (["-config.dp.target_epsilon=3", "--config.dp.target_epsilon=3"], ("3", "3"))):
        assert cli.repeated_overrides(args) == twice.format(*values), args
    assert cli.repeated_overrides(
        ["--config.train.flag", "--noconfig.train.flag"]).startswith(
        "--config.train.flag is given twice ('True', then 'False')")
    assert cli.repeated_overrides(
        ["--config.data.canaries=None", "--config.data.canaries.enabled=True"]) == (
        "--config.data.canaries=None and --config.data.canaries.enabled=True set a config "
        "section and a field inside it; give each config field once (which one counts would "
        "depend on the order of the flags)")
    for fine in (["--config.dp.noise_multiplier=None", "--config.dp.target_epsilon=3",
                  "--config=configs/demo_dp.py", "--workdir=a", "--workdir=b"],
                 ["--config.dp.delta=1", "--", "--config.dp.delta=2"],
                 ["--other.dp.delta=1", "--other.dp.delta=2"]):
        assert cli.repeated_overrides(fine) is None, fine


def test_a_training_workdir_given_as_a_model_folder_is_named(tmp_path):
    """Issue 35: `--config.model.init_from_hf=W` (and export_hf --from_hf, analyze_dchi
    --embeddings) said `W/privacy_report.json: not a dpbert privacy report` or `key
    'model_type' is None`."""
    w = tmp_path / "w"
    (w / "checkpoints").mkdir(parents=True)
    (w / "config.json").write_text("{}")
    assert cli.check_model_folder(str(w), "--from_hf") == (
        f"--from_hf={w}: {w} is a dpbert training workdir; its model is {w}/hf, which is not "
        f"written yet (a run writes it when it ends; or export a checkpoint: python "
        f"launch/export_hf.py --workdir={w} --out=DIR)")
    (w / "hf").mkdir()
    (w / "hf" / "config.json").write_text("{}")
    from configs import finetune_classification
    config = finetune_classification.get_config()
    config.model.init_from_hf = str(w)
    assert cli.check_config_inputs(config) == (
        f"config.model.init_from_hf={w}: {w} is a dpbert training workdir; its model is {w}/hf")
    config.model.init_from_hf = str(w / "hf")
    assert cli.check_config_inputs(config) is None
