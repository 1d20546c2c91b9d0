"""Every launcher, fed a hostile new user's input: --help exits 0, each mistake is ONE line.

Each launcher runs in one subprocess (its imports cost seconds) that drives many command
lines through the real entry point, `dpbert.runtime.cli.run(main, NAME, argv)`, what
`python launch/NAME.py ARGS` does, and reports exit code, stdout and stderr per case.
"""

import gzip
import json
import os
import pathlib
import re
import subprocess
import sys


REPO = pathlib.Path(__file__).resolve().parents[2]

_DRIVER = r"""
import contextlib, io, json, sys, time, types
from absl import flags
from dpbert.runtime import cli
script, name, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
# The launcher becomes __main__ (its docstring is the help, its flags the main module's), all
# but its `if __name__ == "__main__":` block, which each case replaces with cli.run(...).
sys.argv = [script]
source = open(script, encoding="utf-8").read().split('\nif __name__ == "__main__":')[0]
mod = types.ModuleType("__main__")
mod.__file__ = script
sys.modules["__main__"] = mod
exec(compile(source, script, "exec"), mod.__dict__)
results = []
for args in cases:
    flags.FLAGS.unparse_flags()
    out, err = io.StringIO(), io.StringIO()
    code = 0
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.run(mod.main, name, [script, *args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else (print(e.code, file=sys.stderr) or 1))
        except BaseException as e:  # a traceback: reported, and the test fails on it
            import traceback; traceback.print_exc(); code = "traceback"
    results.append([code, out.getvalue(), err.getvalue(), time.perf_counter() - start])
print(json.dumps(results))
"""


def drive(launcher: str, name: str, cases: list[list[str]]) -> list[tuple]:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(REPO / "launch" / launcher), name,
         json.dumps(cases)], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tuple(r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]  # code, out, err, s


def run_cli(launcher: str, *args: str) -> tuple:
    """One real `python launch/LAUNCHER ARGS` (needed where sys.argv at import time matters:
    config_flags registers the --config.* override flags from it)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    proc = subprocess.run([sys.executable, str(REPO / "launch" / launcher), *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def one_error_line(result, code=None) -> str:
    """The single line a failing case printed (log lines of the libraries excluded)."""
    got_code, out, err = result[:3]
    assert got_code != "traceback", err
    assert got_code != 0 and (code is None or got_code == code), result
    # Progress bars (tqdm: "name: 40ex [00:01, 34ex/s]") may precede the message.
    lines = [ln for ln in err.splitlines() if ln.strip() and not re.search(r"\[\d\d:\d\d", ln)]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def read_only_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A folder nobody can write into (root ignores permission bits: a read-only mount)."""
    if os.getuid() == 0:
        return pathlib.Path("/sys/dpbert_test")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    return ro / "sub"


def test_train_launcher(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    demo = "--config=configs/demo_dp.py"
    cases = {
        "help": ["--help"],
        "helpfull": ["--helpfull"],
        "missing config": ["--config=configs/nope.py", f"--workdir={tmp_path / 'w'}"],
        "config dir": ["--config=configs", f"--workdir={tmp_path / 'w'}"],
        "ignored arg": ["--config=configs/demo_dp.py:ARG", f"--workdir={tmp_path / 'w'}"],
        "misspelt arg": ["--config=configs/mimic_dp.py:sise=tiny", f"--workdir={tmp_path / 'w'}"],
        "workdir file": [demo, f"--workdir={a_file}"],
        "workdir in file": [demo, f"--workdir={a_file / 'sub'}"],
        "workdir ro": [demo, f"--workdir={read_only_dir(tmp_path)}"],
        "no workdir": [demo],
        "extra arg": [demo, f"--workdir={tmp_path / 'w'}", "extra"],
    }
    res = dict(zip(cases, drive("train.py", "train", list(cases.values()))))
    # config_flags registers --config.* override flags from sys.argv at import time, which
    # the driver cannot give per case: these are real command lines.
    for key, arg in {"unknown field": ["--config.dp.noise_multiplierr=2"],
                     "wrong type": ["--config.dp.noise_multiplier=abc"],
                     # None unsets a field (config_flags alone would parse it as a float)
                     "unset both": ["--config.dp.noise_multiplier=None",
                                    "--config.dp.target_epsilon=none"],
                     "unset unknown": ["--config.dp.noise_multiplierr=None"],
                     # issue 35: a None override won whatever its position
                     "twice": ["--config.dp.target_epsilon=None",
                               "--config.dp.target_epsilon=1e-6"]}.items():
        res[key] = run_cli("train.py", demo, f"--workdir={tmp_path / 'w'}", *arg)
    for key in ("help", "helpfull"):
        assert res[key][0] == 0 and "--workdir" in res[key][1], res[key]
    expect = {
        "missing config": "train: error: --config=configs/nope.py: config file configs/nope.py "
                          "not found",
        "config dir": "train: error: --config=configs: configs is a directory",
        "unknown field": 'train: error: --config.dp.noise_multiplierr: unknown config field '
                         '\'noise_multiplierr\'; did you mean "noise_multiplier"',
        "wrong type": "train: error: flag --config.dp.noise_multiplier=abc: could not convert",
        "unset both": "train: config.dp.noise_multiplier=None: give a noise multiplier, or "
                      "dp.target_epsilon (training) or dp.total_epsilon (vocabulary + "
                      "training) to calibrate one",
        "unset unknown": "train: error: --config.dp.noise_multiplierr: unknown config field",
        "twice": "train: error: --config.dp.target_epsilon is given twice ('None', then "
                 "'1e-6'); give each config field once",
        "ignored arg": "train: error: configs/demo_dp.py: config arg length='ARG' must be one "
                       "of long",
        "misspelt arg": "train: error: configs/mimic_dp.py: unknown config arg 'sise'; did you "
                        "mean 'size'?",
        "workdir file": f"train: --workdir={a_file}: is a file, not a folder",
        "workdir in file": f"train: --workdir={a_file / 'sub'}: cannot be created",
        "workdir ro": "not writable",
        "no workdir": "train: error: flag --workdir=None: Flag --workdir must have a value",
        "extra arg": "train: error: unexpected arguments: ['extra']",
    }
    for key, start in expect.items():
        line = one_error_line(res[key])
        assert line.startswith(start) or start in line, (key, line)
    assert not (tmp_path / "w").exists()


def test_build_vocab_launcher(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"sentence {i} of document {i}.\n\n" for i in range(40)))
    notes = tmp_path / "NOTEEVENTS.csv"
    notes.write_text("ROW_ID,SUBJECT_ID,HADM_ID,CHARTDATE,CHARTTIME,STORETIME,CATEGORY,"
                     "DESCRIPTION,CGID,ISERROR,TEXT\n1,2,3,,,,Radiology,X,,,\"a note\"\n")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(os.urandom(30000))
    truncated = tmp_path / "cut.txt.gz"
    data = gzip.compress(corpus.read_bytes() * 200)
    truncated.write_bytes(data[:len(data) // 2])
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    base = ["--vocab_size=2000", "--epsilon=8", "--delta=1e-6", "--num_workers=1"]
    out = f"--out={tmp_path / 'o'}"
    cases = {
        "help": ["--help"],
        "num_unused": [f"--input={corpus}", *base, out, "--num_unused=-3"],
        "vocab_size": [f"--input={corpus}", "--vocab_size=0", "--epsilon=8", "--delta=1e-6", out],
        "max_bad": [f"--input={corpus}", *base, out, "--max_bad_fraction=2"],
        "nan delta": [f"--input={corpus}", *base[:3], "--delta=nan", out],
        "delta 1/N": [f"--input={corpus}", *base[:3], "--delta=0.1", out],
        "format": [f"--input={notes}", "--format=text", *base, out],
        "garbage": [f"--input={garbage}", *base, out],
        "truncated": [f"--input={truncated}", *base, out],
        "dir input": [f"--input={tmp_path}", *base, out],
        "out file": [f"--input={corpus}", *base, f"--out={a_file}"],
        "no eps": [f"--input={corpus}", "--vocab_size=2000", out],
    }
    res = dict(zip(cases, drive("build_vocab.py", "build_vocab", list(cases.values()))))
    assert res["help"][0] == 0 and "--max_bad_fraction" in res["help"][1]
    expect = {
        "num_unused": "flag --num_unused=-3: -3 is not a non-negative integer",
        "vocab_size": "flag --vocab_size=0: 0 is not a positive integer",
        "max_bad": "flag --max_bad_fraction=2: 2.0 is not a number in the range [0.0, 1.0]",
        "nan delta": "delta must be in (0, 1), got nan",
        "delta 1/N": "vocabulary delta=0.1 must be < 1/num_examples = 0.025 (num_examples=40)",
        "format": "line 1 is a MIMIC-III NOTEEVENTS header",
        "garbage": "cannot be parsed",
        "truncated": "the gzip data ends early",
        "dir input": "is a directory; expected a corpus file",
        "out file": "is a file, not a folder",
        "no eps": "--epsilon and --delta are required (or pass --no_dp)",
    }
    for key, part in expect.items():
        assert part in one_error_line(res[key]), (key, res[key])
    assert not (tmp_path / "o").exists()


def test_export_and_analyze_launchers(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    ro = read_only_dir(tmp_path)
    src = tmp_path / "src"  # not a model: every case is refused before it is read
    src.mkdir()
    work = tmp_path / "work"   # a training workdir (issue 35: given where a model is expected)
    (work / "checkpoints").mkdir(parents=True)
    (work / "run.json").write_text("{}")
    cases = {
        "help": ["--help"],
        "no source": [f"--out={tmp_path / 'o'}"],
        "workdir as model": [f"--from_hf={work}", f"--out={tmp_path / 'o'}"],
        "out file": [f"--from_hf={src}", f"--out={a_file}"],
        "out non-empty": [f"--from_hf={src}", f"--out={full}"],
        "overwrite non-model": [f"--from_hf={src}", f"--out={full}", "--overwrite"],
        "out ro": [f"--from_hf={src}", f"--out={ro}"],
        "negative step": [f"--workdir={tmp_path}", f"--out={tmp_path / 'o'}", "--step=-1"],
        "not a workdir": [f"--workdir={tmp_path}", f"--out={tmp_path / 'o'}"],
    }
    res = dict(zip(cases, drive("export_hf.py", "export_hf", list(cases.values()))))
    assert res["help"][0] == 0 and "--overwrite" in res["help"][1]
    expect = {
        "no source": "give exactly one source",
        "out file": "is a file; the export needs a folder",
        "out non-empty": "is not empty; an export into it would mix the files of two models",
        "overwrite non-model": "not a Hugging Face model folder",
        "out ro": "read-only",
        "negative step": "flag --step=-1: -1 is not a non-negative integer",
        "not a workdir": "run.json: missing",
        "workdir as model": f"--from_hf={work}: {work} is a dpbert training workdir; its model "
                            f"is {work}/hf, which is not written yet",
    }
    for key, part in expect.items():
        assert part in one_error_line(res[key]), (key, res[key])
    assert [p.name for p in full.iterdir()] == ["notes.txt"]

    cases = {
        "help": ["--help"],
        "out file": ["--embeddings=x", "--corpus=y", f"--out={a_file}"],
        "no corpus": ["--embeddings=x", f"--out={tmp_path / 'a'}"],
        "bad eta": [f"--embeddings={src}", "--corpus=y", "--eta=abc",
                    f"--out={tmp_path / 'a'}"],
        "tiny eta": [f"--embeddings={src}", "--corpus=y", "--eta=1e-40",
                     f"--out={tmp_path / 'a'}"],
        "workdir as model": [f"--embeddings={work}", "--corpus=y", f"--out={tmp_path / 'a'}"],
    }
    res = dict(zip(cases, drive("analyze_dchi.py", "analyze_dchi", list(cases.values()))))
    assert res["help"][0] == 0 and "--vocab_sample" in res["help"][1]
    expect = {"out file": "is a file, not a folder", "no corpus": "Flag --corpus must have",
              "bad eta": "--eta: 'abc' is not a number",
              "tiny eta": "--eta: '1e-40' is below 1e-06",
              "workdir as model": f"--embeddings={work}: {work} is a dpbert training workdir"}
    for key, part in expect.items():
        assert part in one_error_line(res[key]), (key, res[key])


def test_privacy_launcher():
    base = ["--num_examples=17316", "--batch_size=128", "--steps=20", "--delta=1e-5"]
    cases = {
        "help": ["--help"],
        "no command": base,
        "bad command": ["epsilonn", *base],
        "tiny sigma": ["epsilon", *base, "--noise_multiplier=0.01"],
        "too tiny sigma": ["epsilon", *base, "--noise_multiplier=0.0001"],
        "nan sigma": ["epsilon", *base, "--noise_multiplier=nan"],
        "negative steps": ["epsilon", *base, "--steps=-5", "--noise_multiplier=1"],
        "zero examples": ["epsilon", *base, "--num_examples=0", "--noise_multiplier=1"],
        "delta 1/N": ["epsilon", *base, "--delta=0.1", "--noise_multiplier=1"],
        "float steps": ["epsilon", *base, "--steps=2.5", "--noise_multiplier=1"],
        "huge sigma": ["epsilon", *base, "--noise_multiplier=1e300"],
    }
    res = dict(zip(cases, drive("privacy.py", "privacy.py", list(cases.values()))))
    assert res["help"][0] == 0 and "--noise_multiplier" in res["help"][1]
    code, out, err, seconds = res["tiny sigma"]
    # Minutes and > 4 GB before; now seconds, with a note that the grid was coarsened.
    assert code == 0 and "epsilon = " in out and "NOTE: Noise multiplier too small for the default PLD grid" in out
    assert seconds < 60
    expect = {
        "no command": "give exactly one command: epsilon | calibrate",
        "bad command": "give exactly one command",
        "too tiny sigma": "noise multiplier 0.0001 (effective) is too small to account",
        "nan sigma": "noise_multiplier=nan must be a positive finite number",
        "negative steps": "steps=-5 must be >= 0",
        "zero examples": "num_examples=0 must be >= 1",
        "delta 1/N": "delta=0.1 must be < 1/num_examples",
        "float steps": "flag --steps=2.5: invalid literal for int()",
        "huge sigma": "noise_multiplier=1e+300 (effective 1e+300) is above 1e+06",
    }
    for key, part in expect.items():
        assert part in one_error_line(res[key]), (key, res[key])


def test_audit_and_exposure_launchers(tmp_path):
    cases = {
        "help": ["--help"],
        "no out": ["--config=configs/demo_dp.py"],
        "bad m": ["--config=configs/demo_dp.py", f"--out={tmp_path / 'a'}", "--m=many"],
    }
    res = dict(zip(cases, drive("audit.py", "audit", list(cases.values()))))
    assert res["help"][0] == 0 and "--confidence" in res["help"][1]
    expect = {"no out": "Flag --out must have a value", "bad m": "flag --m=many"}
    for key, part in expect.items():
        assert part in one_error_line(res[key]), (key, res[key])
    # The --config.* overrides work as in launch/train.py (config_flags registers them from the
    # real sys.argv: a real process): "none" unsets the calibrated sigma, and the first problem
    # is the missing corpus, one line.
    code, _, err = run_cli("audit.py", "--config=configs/demo_dp.py", f"--out={tmp_path / 'b'}",
                           "--config.dp.noise_multiplier=none", "--config.dp.target_epsilon=1",
                           "--config.data.corpus=noteevents",
                           f"--config.data.paths={tmp_path / 'missing.csv.gz'}")
    assert code == 2, err
    line = one_error_line((code, "", err))
    assert line.startswith("audit: error: config.data.paths:") and "does not exist" in line

    cases = {
        "help": ["--help"],
        "not a workdir": [f"--workdir={tmp_path}"],
        "labels": [f"--workdir={tmp_path}", f"--compare={tmp_path}", "--labels=a"],
    }
    res = dict(zip(cases, drive("exposure.py", "exposure", list(cases.values()))))
    assert res["help"][0] == 0 and "--compare" in res["help"][1]
    expect = {"not a workdir": "run.json: missing; is", "labels": "--labels needs 2 distinct"}
    for key, part in expect.items():
        assert one_error_line(res[key]).startswith("exposure: error: ")
        assert part in one_error_line(res[key]), (key, res[key])


def test_degenerate_paths_and_broken_config_files_are_one_line(tmp_path):
    """Issue 35: an empty path (the current directory), `.`, an output that is or lies in its
    source, a FIFO input, a config file that fails to import or returns the wrong type, and
    arguments checked only after the work: each is one line naming the flag, field or file,
    and nothing is written (the launchers run in the checkout: nothing new appears there)."""
    before = sorted(os.listdir(REPO))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    model = tmp_path / "model"   # a (tiny) Hugging Face folder: config.json is all that is read
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert"}))
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    configs = {
        "syntax": "def get_config(:\n    pass\n",
        "raises": "def get_config():\n    raise RuntimeError('boom')\n",
        "dict": "def get_config():\n    return {'a': 1}\n",
        "none": "def get_config():\n    return None\n",
        "import": "import no_such_module\n",
        "inside": "from configs import demo_dp\n\n\ndef get_config():\n    c = demo_dp.get_config()"
                  f"\n    c.model.init_from_hf = {str(model)!r}\n    return c\n",
        "seed": "from configs import demo_dp\n\n\ndef get_config():\n    c = demo_dp.get_config()"
                "\n    c.vocab.seed = -1\n    return c\n",
    }
    for name, text in configs.items():
        (tmp_path / f"{name}.py").write_text(text)
    w = f"--workdir={tmp_path / 'w'}"
    train = {
        "syntax": [f"--config={tmp_path / 'syntax.py'}", w],
        "raises": [f"--config={tmp_path / 'raises.py'}", w],
        "dict": [f"--config={tmp_path / 'dict.py'}", w],
        "none": [f"--config={tmp_path / 'none.py'}", w],
        "import": [f"--config={tmp_path / 'import.py'}", w],
        "fifo config": [f"--config={fifo}", w],
        "empty workdir": ["--config=configs/demo_dp.py", "--workdir="],
        "dot workdir": ["--config=configs/demo_dp.py", "--workdir=."],
        "inside model": [f"--config={tmp_path / 'inside.py'}", f"--workdir={model / 'w'}"],
        "seed": [f"--config={tmp_path / 'seed.py'}", w],
    }
    res = dict(zip(train, drive("train.py", "train", list(train.values()))))
    expect = {
        "syntax": f"train: error: --config={tmp_path / 'syntax.py'}: {tmp_path / 'syntax.py'}, "
                  "line 1: SyntaxError: invalid syntax (the config file cannot be imported)",
        "raises": f"train: error: --config={tmp_path / 'raises.py'}: get_config() raised "
                  f"RuntimeError: boom ({tmp_path / 'raises.py'}, line 2)",
        "dict": f"train: error: --config={tmp_path / 'dict.py'}: get_config() returned a dict, "
                "not an ml_collections.ConfigDict",
        "none": f"train: error: --config={tmp_path / 'none.py'}: get_config() returned None",
        "import": f"train: error: --config={tmp_path / 'import.py'}: importing it raised "
                  "ModuleNotFoundError: No module named 'no_such_module' "
                  f"({tmp_path / 'import.py'}, line 1)",
        "fifo config": f"train: error: --config={fifo}: {fifo} is a named pipe (FIFO)",
        "empty workdir": "train: --workdir=: is empty (an empty path would mean the current "
                         "directory)",
        "dot workdir": "train: --workdir=.: is the current directory",
        "inside model": f"train: --workdir={model / 'w'}: is inside the source "
                        f"config.model.init_from_hf={model}",
        "seed": "train: config.vocab.seed=-1: a seed must be an integer in [0, 4294967295]",
    }
    for key, start in expect.items():
        assert one_error_line(res[key]).startswith(start), (key, res[key])

    src = f"--from_hf={model}"
    cases = {
        "finetune empty": ("finetune.py", "finetune",
                           ["--config=configs/finetune_classification.py", "--workdir="]),
        "vocab empty out": ("build_vocab.py", "build_vocab",
                            [f"--input={a_file}", "--vocab_size=2000", "--no_dp", "--out="]),
        "vocab fifo": ("build_vocab.py", "build_vocab",
                       [f"--input={fifo}", "--vocab_size=2000", "--no_dp", "--out=x"]),
        "vocab seed": ("build_vocab.py", "build_vocab",
                       [f"--input={a_file}", "--vocab_size=2000", "--no_dp", "--seed=-1",
                        "--out=x"]),
        "export empty": ("export_hf.py", "export_hf", [src, "--out="]),
        "export onto source": ("export_hf.py", "export_hf", [src, f"--out={model}",
                                                             "--overwrite"]),
        "export inside": ("export_hf.py", "export_hf", [src, f"--out={model / 'sub'}"]),
        "dchi gpt2": ("analyze_dchi.py", "analyze_dchi", [f"--embeddings={gpt2}",
                                                          f"--corpus={a_file}",
                                                          f"--out={tmp_path / 'a'}"]),
        "dchi fifo": ("analyze_dchi.py", "analyze_dchi", [f"--embeddings={model}",
                                                          f"--corpus={fifo}",
                                                          f"--out={tmp_path / 'a'}"]),
        "dchi inside": ("analyze_dchi.py", "analyze_dchi", [f"--embeddings={model}",
                                                            f"--corpus={a_file}",
                                                            f"--out={model / 'a'}"]),
        "audit file": ("audit.py", "audit", ["--config=configs/demo_dp.py", f"--out={a_file}"]),
        "audit confidence": ("audit.py", "audit", ["--config=configs/demo_dp.py", "--out=o",
                                                   "--confidence=0"]),
        "audit m": ("audit.py", "audit", ["--config=configs/demo_dp.py", "--out=o",
                                          "--m=1000000000"]),
        "exposure out": ("exposure.py", "exposure", [f"--workdir={model}", f"--out={model}"]),
        "exposure empty": ("exposure.py", "exposure", ["--workdir="]),
    }
    by_launcher = {}
    for key, (script, name, args) in cases.items():
        by_launcher.setdefault((script, name), []).append((key, args))
    for (script, name), items in by_launcher.items():
        for (key, _), r in zip(items, drive(script, name, [a for _, a in items])):
            res[key] = r
    expect = {
        "finetune empty": "finetune: error: --workdir=: is empty",
        "vocab empty out": "build_vocab: error: --out=: is empty",
        "vocab fifo": f"build_vocab: error: --input={fifo}: is a named pipe (FIFO)",
        "vocab seed": "build_vocab: error: flag --seed=-1: -1 is not an integer in the range "
                      "[0, 4294967295]",
        "export empty": "export_hf: --out=: is empty",
        "export onto source": f"export_hf: --out={model}: is the source {src} itself",
        "export inside": f"export_hf: --out={model / 'sub'}: is inside the source {src}",
        "dchi gpt2": f"analyze_dchi: --embeddings: {gpt2 / 'config.json'}: key 'model_type' is "
                     "'gpt2'; dpbert reads BERT checkpoints only",
        "dchi fifo": f"analyze_dchi: --corpus={fifo}: is a named pipe (FIFO)",
        "dchi inside": f"analyze_dchi: --out={model / 'a'}: is inside the source "
                       f"--embeddings={model}",
        "audit file": f"audit: error: --out={a_file}: is a file, not a folder",
        "audit confidence": "audit: error: --confidence=0.0: must be a number in (0, 1)",
        "audit m": "audit: error: --m=1000000000: the number of audit canaries must be an "
                   "integer in [2, 100000]",
        "exposure out": f"exposure: error: --out={model}: is the source --workdir={model} "
                        "itself",
        "exposure empty": "exposure: error: --workdir= is empty; give a path",
    }
    for key, start in expect.items():
        assert one_error_line(res[key]).startswith(start), (key, res[key])
    assert sorted(os.listdir(REPO)) == before
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
    assert not (tmp_path / "w").exists() and not (tmp_path / "a").exists()
