"""The pretraining task on the sharded DP training loop end to end: demo config, sharding/multi-host equivalence,
kill-and-resume, SIGTERM, budget, bad configs, export."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import transformers

from configs import demo_dp
from dpbert.runtime import checkpointing
from dpbert import dp as dp_lib
from dpbert.dp import plan as plan_lib
from dpbert.errors import ConfigError
from dpbert.tasks import pretraining as train

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """Shared instance cache and vocabulary so each run skips the offline stages."""
    return tmp_path_factory.mktemp("train_cache")


# The mechanism and optimizer the tests built on the demo config were written for (the demo's
# before its fifth round, DP-SGD with AdamW; since then BandMF with SGD, which
# test_pretraining_bandmf and test_demo_config_end_to_end run).
DPSGD_ADAMW = {"dp.mechanism": "dpsgd", "dp.num_bands": 1, "optimizer.name": "adamw",
               "optimizer.learning_rate": 1.4e-2, "optimizer.weight_decay": 0.01}

# The demo config shrunk to seconds: 48 synthetic notes, seq 32, 4 steps. Flat
# "section.field" keys, so the same values serve in-process runs and launch/train.py flags.
SMALL = {
    "data.synthetic_num_notes": 48, "data.max_seq_length": 32,
    "data.max_predictions_per_seq": 5, "data.eval_fraction": 0.1, "vocab.size": 1000,
    "model.max_position_embeddings": 32, "batch.expected_batch_size": 16,
    "batch.physical_batch_size": 16, "batch.microbatch_size": 8, "dp.noise_multiplier": 1.0,
    # Never binding here; test_budget_* covers the budget.
    "dp.target_epsilon": 100.0, "dp.delta": 1e-4, "dp.overflow_probability": 1e-3,
    "train.num_steps": 4, "train.log_every": 2, "train.eval_every": 2, "train.eval_batches": 1,
    "train.eval_batch_size": 16, "optimizer.warmup_steps": 1, "checkpoint.every_steps": 2,
    "checkpoint.async_save": False,
    # Runs that are compared with each other share their randomness: a seeded vocabulary and
    # noise/sampling from config.seed (NOT private). The secret path is what the demo and
    # test_secret_* tests run.
    "vocab.seed": 0, "dp.insecure_seeded_noise": True,
    # The demo trains without dropout; these tests check the dropout keys' handling.
    "model.hidden_dropout_prob": 0.1, "model.attention_probs_dropout_prob": 0.1,
    # The model these tests were written for (the demo's is micro since issue 36), with the
    # NSP loss (the demo trains MLM only).
    "model.size": "tiny", "train.nsp": True,
    # The old demo's vocabulary budget, which the refusal tests' numbers are computed for.
    "vocab.epsilon": 2.0, "vocab.delta": 1e-6,
    # The demo's sentence, shortened: 48 notes' vocabulary spells most words by characters.
    "fill_mask": "with [MASK] pain .",
    **DPSGD_ADAMW,
}
SECRET = {"vocab.seed": None, "dp.insecure_seeded_noise": False}


def override(c, values: dict):
    """Sets flat "section.field" keys on a ConfigDict; returns it."""
    for key, value in values.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def small_config(cache_dir: pathlib.Path, **overrides):
    return override(demo_dp.get_config(), {
        **SMALL, "data.cache_dir": str(cache_dir / "instances"), **overrides})


def saved_dropout_key(workdir: pathlib.Path) -> np.ndarray:
    """The DP state's per-example (dropout) key in the newest checkpoint of a workdir."""
    import orbax.checkpoint as ocp

    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    manager, step = ckpt._manager, ckpt.latest_step()  # noqa: SLF001
    tree = manager.item_metadata(step)["state"]
    tree = getattr(tree, "tree", tree)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                            tree)
    out = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    ckpt.close()
    return np.asarray(out["state"]["dp"]["rng"])


def final_params(workdir: pathlib.Path, step: int | None = None):
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    step = ckpt.latest_step() if step is None else step
    params, _ = ckpt.restore_params(step)
    ckpt.close()
    return params, step


def assert_trees(a, b, exact: bool, **tol):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if exact:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, **tol)


def run_cli(*args, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def cli_train_args(workdir, cache_dir, extra=()):
    """launch/train.py flags reproducing `small_config(cache_dir)`."""
    flat = {f"--config.{k}": str(v)
            for k, v in {**SMALL, "data.cache_dir": str(cache_dir / "instances")}.items()}
    others = []
    for flag in extra:  # a test's flag replaces the small config's value: each field given once
        name, _, value = str(flag).partition("=")
        if name.startswith("--config."):
            flat[name] = value
        else:
            others.append(flag)
    args = [REPO / "launch" / "train.py", "--config=configs/demo_dp.py", f"--workdir={workdir}"]
    return args + [f"{k}={v}" for k, v in flat.items()] + others


@pytest.mark.slow
def test_demo_config_end_to_end(cache_dir, tmp_path, capsys):
    workdir = tmp_path / "run"
    # The demo's own model size, loss, mechanism and optimizer (SMALL pins tiny with NSP,
    # DP-SGD and AdamW for the other tests).
    demo = demo_dp.get_config()
    own = {"model.size": demo.model.size, "train.nsp": demo.train.nsp,
           "dp.mechanism": demo.dp.mechanism, "dp.num_bands": demo.dp.num_bands,
           "optimizer.name": demo.optimizer.name,
           "optimizer.learning_rate": demo.optimizer.learning_rate,
           "optimizer.weight_decay": demo.optimizer.weight_decay}
    assert demo.train.nsp is False and (demo.dp.mechanism, demo.optimizer.name) == ("bandmf",
                                                                                    "sgd")
    report = train.train_and_evaluate(small_config(cache_dir, **SECRET, **own), workdir)
    # The closing fill-in of the demo's sentence, from the exported model, then the summary.
    out = capsys.readouterr().out.splitlines()
    fill = [l for l in out if l.startswith("fill-in: 'with [MASK] pain .' -> ")]
    assert len(fill) == 1 and fill[0].count(" | ") == 4, out[-5:]
    assert out[-1].startswith("done: 4 steps")
    assert f"(BandMF, {demo.dp.num_bands} band(s), pld, cyclic poisson" in out[-1]
    saved = json.loads((workdir / "privacy_report.json").read_text())
    training = saved["training"]
    for field in ("epsilon", "delta", "noise_multiplier", "effective_noise_multiplier",
                  "clip_norm", "sampling", "expected_batch_size", "num_examples", "steps",
                  "accountant", "privacy_unit", "noise_mode"):
        assert field in training, field
    assert saved == json.loads(json.dumps(report, default=str))
    assert (training["mechanism"], training["num_bands"]) == ("bandmf", demo.dp.num_bands)
    assert training["steps"] == 4 and np.isfinite(training["epsilon"]) and training["epsilon"] > 0
    assert training["secret_randomness"] is True and saved["private"] is True
    assert saved["vocabulary"]["dp"] is True
    # The reported training epsilon is what launch/privacy.py says for the same parameters.
    proc = subprocess.run(
        [sys.executable, str(REPO / "launch" / "privacy.py"), "epsilon",
         f"--num_examples={training['num_examples']}", "--batch_size=16",
         "--noise_multiplier=1.0", "--steps=4", f"--delta={training['delta']}",
         f"--max_batch_size={training['max_batch_size']}", "--mechanism=bandmf",
         f"--num_bands={demo.dp.num_bands}", "--json"],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["epsilon"] == pytest.approx(training["epsilon"], rel=1e-9)
    # The headline is the total: the vocabulary plus training, by basic composition. Removing
    # one training sequence modifies the (up to 2) notes it reads from: the vocabulary's cost is
    # group privacy at 2 of its replace-one guarantee, computed from its mechanism.
    from data_pipelines import vocab_privacy

    vocab = saved["vocabulary"]
    assert (vocab["relation"], vocab["records"]) == ("replace", 2)
    built = json.loads((workdir / "vocab" / "vocab_privacy.json").read_text())
    want = vocab_privacy.histogram_guarantee(vocab_privacy.privacy_from_report(built),
                                             "replace", 2)
    assert (vocab["epsilon"], vocab["delta"]) == (want.epsilon, want.delta)
    assert vocab["epsilon"] > 2 * vocab["vocabulary_epsilon"]  # more than removing 2 notes
    assert saved["epsilon"] == pytest.approx(vocab["epsilon"] + training["epsilon"])
    assert saved["delta"] == pytest.approx(vocab["delta"] + training["delta"])
    for unit in ("sentence", "document", "subject"):
        m = saved["unit_multiplicity"][unit]
        assert m["max"] >= 1 and 0 < m["mean"] <= m["max"], (unit, m)
    # TensorBoard event files and the metric log.
    assert list((workdir / "tensorboard").glob("events.out.tfevents.*"))
    lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any("train/mlm_accuracy" in l for l in lines)
    assert any("eval/mlm_accuracy" in l for l in lines)
    assert all("privacy/epsilon" in l for l in lines if "train/loss" in l)
    # The Hugging Face export loads without missing or unexpected keys.
    model, info = transformers.BertForPreTraining.from_pretrained(workdir / "hf",
                                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    card = (workdir / "hf" / "README.md").read_text()
    assert saved["headline"] in card and f"({saved['epsilon']:.3g}, " in saved["headline"]
    # MLM only: the NSP head and the pooler were frozen (not in d) and the card says so.
    trained = json.loads((workdir / "run.json").read_text())["trainable"]
    assert not any("pooler" in g or "seq_relationship" in g for g in trained["groups"]), trained
    pooler = sum(np.asarray(v).size for k, v in model.state_dict().items()
                 if "pooler" in k or "seq_relationship" in k)
    assert trained["parameters"] == trained["total_parameters"] - pooler
    assert "## Next-sentence head" in card and "`train.nsp=False`" in card
    assert "one training sequence of at most 32 tokens" in card
    assert "follows only by group privacy" in card
    assert "| vocabulary.epsilon |" in card and '"dp": true' not in card  # fields, not JSON
    # What ships is the public report: the workdir's without exact corpus statistics (grep
    # over every text file of the exported folder).
    from dpbert.reporting import report as report_lib

    shipped = json.loads((workdir / "hf" / "privacy_report.json").read_text())
    assert shipped == report_lib.public_report(saved)
    exported = " ".join(f.read_text() for f in (workdir / "hf").iterdir()
                        if f.suffix in (".json", ".md", ".txt"))
    for key in ("unit_multiplicity", "documents_per_example_max", "subjects_per_example_max",
                "train_documents", "train_subjects", '"num_examples": ' + str(
                    built["num_examples"]), "num_distinct_words", "records_read"):
        assert key not in exported, key
    for unit in ("sentence", "document", "subject"):
        m = saved["unit_multiplicity"][unit]
        assert f"in up to {m['max']}" not in exported and f"mean {m['mean']:.3g}" not in card
    # The vocabulary's report travels with the export, without the corpus counts.
    shipped = json.loads((workdir / "hf" / "vocab_privacy.json").read_text())
    assert shipped["epsilon"] == vocab["vocabulary_epsilon"] and "num_examples" not in shipped
    # Nothing that derives the noise or the batches is written outside the checkpoint.
    sampler_seed = checkpointing.Checkpointer(workdir / "checkpoints").read_meta(4)[
        "sampler"]["seed"]
    for path in workdir.rglob("*"):
        if path.is_file() and "checkpoints" not in path.parts and path.suffix in (
                ".json", ".jsonl", ".md", ".txt"):
            assert str(sampler_seed) not in path.read_text(errors="ignore"), path
    # Exporting a saved step from the workdir gives the same weights.
    proc = run_cli(REPO / "launch" / "export_hf.py", f"--workdir={workdir}",
                   f"--out={tmp_path / 'exp2'}", "--step=2")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "differential privacy" in (tmp_path / "exp2" / "README.md").read_text()


@pytest.mark.slow
def test_continuing_from_a_dp_export_composes_what_it_spent(cache_dir, tmp_path):
    """Issue 29's repro: a second run initialised from a first run's export, on the same notes,
    reports the composition of both trainings (one dp_accounting event of 6 steps, not 3) and
    counts the shared vocabulary once."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    steps = {"train.num_steps": 3, "train.eval_every": 0, "checkpoint.every_steps": 0}
    first = train.train_and_evaluate(small_config(cache_dir, **SECRET, **steps),
                                     tmp_path / "first")
    second = train.train_and_evaluate(small_config(cache_dir, **SECRET, **steps, **{
        "model.init_from_hf": str(tmp_path / "first" / "hf")}), tmp_path / "second")
    t1, t2 = first["training"], second["training"]

    def event(t):
        spec = t["segments"][0]["spec"]
        q = spec["expected_batch_size"] / spec["num_examples"]
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.TruncatedSubsampledGaussianDpEvent(
                spec["num_examples"], q, spec["max_batch_size"], spec["noise_multiplier"]),
            t["segments"][0]["steps"])

    both = pld_privacy_accountant.PLDAccountant().compose(
        dp_accounting.ComposedDpEvent([event(t1), event(t2)])).get_epsilon(t2["delta"])
    assert t2["epsilon"] == pytest.approx(both, rel=1e-9)
    assert t2["this_run_epsilon"] == pytest.approx(t1["epsilon"], rel=1e-9)  # same mechanism
    assert t2["inherited_segments"] == t1["segments"]
    # The same vocabulary (the first run's, shipped in its export): counted once.
    v1, v2 = first["vocabulary"], second["vocabulary"]
    assert v2["vocab_sha256"] == v1["vocab_sha256"] and v2["origin"] == "checkpoint"
    assert v2["epsilon"] == v1["epsilon"] and "inherited_vocabularies" not in second
    assert second["epsilon"] == pytest.approx(v2["epsilon"] + both)
    assert second["epsilon"] >= first["epsilon"] + (both - t1["epsilon"]) - 1e-9
    assert second["lineage"][0]["relation"] == "same"
    card = (tmp_path / "second" / "hf" / "README.md").read_text()
    assert "Starting model (model.init_from_hf)" in card and first["headline"] in card
    # A third generation carries both earlier trainings.
    shipped = json.loads((tmp_path / "second" / "hf" / "privacy_report.json").read_text())
    assert shipped["training"]["inherited_segments"] == t1["segments"]


# Plan-only tests: a physical batch as large as N means no truncation, which keeps the
# accountant fast (truncated Poisson accounting is covered in tests/dpbert/dp).
UNTRUNCATED = {"batch.physical_batch_size": 1024, "batch.microbatch_size": None}


def test_noise_multiplier_changes_epsilon_as_the_accountant_says(cache_dir):
    for sigma in (0.8, 1.6):
        c = small_config(cache_dir, **{"dp.noise_multiplier": sigma, "train.num_steps": 50,
                                       **UNTRUNCATED})
        plan = plan_lib.from_config(c, num_examples=1000, num_shards=8)
        expected = dp_lib.compute_epsilon(
            noise_multiplier=sigma, expected_batch_size=16, num_examples=1000, steps=50,
            delta=1e-4)
        assert plan.spec.max_batch_size is None
        assert plan.spec.epsilon(50) == pytest.approx(expected, rel=1e-12)
    lo = plan_lib.from_config(small_config(cache_dir, **{"dp.noise_multiplier": 1.6, **UNTRUNCATED}),
                         1000, 8)
    hi = plan_lib.from_config(small_config(cache_dir, **{"dp.noise_multiplier": 0.8, **UNTRUNCATED}),
                         1000, 8)
    assert lo.spec.epsilon(50) < hi.spec.epsilon(50)


def test_budget_stops_at_last_step_within_target(cache_dir):
    c = small_config(cache_dir, **{"train.num_steps": 1000, "dp.target_epsilon": None,
                                   **UNTRUNCATED})
    eps_at = lambda t: plan_lib.from_config(c, 1000, 8).spec.epsilon(t)
    target = (eps_at(300) + eps_at(301)) / 2
    c.dp.target_epsilon = target
    plan = plan_lib.from_config(c, 1000, 8)
    assert plan.num_steps == 300
    assert plan.spec.epsilon(300) <= target < plan.spec.epsilon(301)


def test_calibrates_sigma_when_only_a_target_is_given(cache_dir):
    c = small_config(cache_dir, **{"dp.noise_multiplier": None, "dp.target_epsilon": 3.0,
                                   "train.num_steps": 200, **UNTRUNCATED})
    plan = plan_lib.from_config(c, 1000, 8)
    assert plan.num_steps == 200
    assert plan.spec.epsilon(200) <= 3.0
    assert plan.spec.epsilon(200) > 2.9  # calibrated, not merely safe


@pytest.mark.parametrize("overrides,match", [
    ({"batch.physical_batch_size": 12, "batch.microbatch_size": None},
     "physical_batch_size=12 is not divisible by the 8 devices"),
    ({"dp.delta": 0.5}, r"dp.delta=0.5 must be < 1/N"),
    ({"data.corpus": "text", "data.paths": ("/nonexistent/corpus.txt",),
      "vocab.file": ""}, "nonexistent/corpus.txt"),
    ({"batch.microbatch_size": 5}, "microbatch_size=5.*must divide"),
    ({"dp.clip_norm": 0.0}, "clip_norm"),
    ({"dp.clipping": "ghost"}, r"config.dp.clipping='ghost': must be one of"),
    ({"data.do_lower_case": False}, r"config.vocab.size=1000: must be >= the 1382 tokens: "
                                    r".* alphabet of CASED text: data.do_lower_case=False"),
    ({"dp.clipping": "mixed_ghost", "dp.privacy_unit": "note"},
     r"config.dp.clipping='mixed_ghost': mixed_ghost clips one example"),
])
def test_bad_configs_fail_with_one_clear_error(cache_dir, tmp_path, overrides, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        train.train_and_evaluate(small_config(cache_dir, **overrides), tmp_path / "bad")


def test_a_vocab_file_without_special_tokens_names_the_users_file(cache_dir, tmp_path):
    """Issue 35: the message named the workdir's copy (WORKDIR/vocab/vocab.txt), and that
    broken copy then made a rerun with the file fixed fail ("differs from the vocabulary this
    run started with")."""
    vocab = tmp_path / "my_vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nworld\n")
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        train.train_and_evaluate(small_config(cache_dir, **{"vocab.file": str(vocab)}), workdir)
    assert str(e.value) == (
        f"config.vocab.file={str(vocab)!r}: vocab file {vocab} lacks the special token(s) "
        "['[MASK]'] (a BERT vocab.txt has each of [PAD], [UNK], [CLS], [SEP], [MASK] on a line "
        "of its own)")
    assert not (workdir / "vocab").exists()


def test_unknown_config_field_is_refused_by_the_launcher(tmp_path):
    proc = run_cli(REPO / "launch" / "train.py", "--config=configs/demo_dp.py",
                   f"--workdir={tmp_path}", "--config.dp.noise_multiplierr=2.0")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "noise_multiplierr" in out


@pytest.mark.slow
def test_incompatible_checkpoint_is_refused(cache_dir, tmp_path):
    workdir = tmp_path / "run"
    # 3 steps, as in the other 8-device runs: the step count is compiled into the step (the
    # schedule), so runs of the same count share one XLA compilation (the tests' cache).
    train.train_and_evaluate(small_config(cache_dir, **{"train.num_steps": 3}), workdir)
    with pytest.raises(checkpointing.IncompatibleCheckpointError,
                       match=r"dp.clip_norm: checkpoint=1.0 config=2.0"):
        train.train_and_evaluate(small_config(cache_dir, **{"dp.clip_norm": 2.0}), workdir)
    # More steps is a compatible change: the run resumes and continues.
    report = train.train_and_evaluate(small_config(cache_dir, **{"train.num_steps": 4}), workdir)
    assert report["steps"] == 4


@pytest.mark.slow
def test_secret_randomness_differs_between_runs_of_the_same_command(cache_dir, tmp_path):
    # At least two steps: the learning rate of the first (warm-up) step is 0 (3, to share the
    # compiled step of the other 3-step runs).
    c = small_config(cache_dir, **{"train.num_steps": 3, "train.export_hf": False,
                                   "train.eval_every": 0, "checkpoint.every_steps": 0,
                                   "dp.insecure_seeded_noise": False})
    for name in ("a", "b"):
        train.train_and_evaluate(c, tmp_path / name)
    a, _ = final_params(tmp_path / "a")
    b, _ = final_params(tmp_path / "b")
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
    assert all(moved)  # every leaf got other noise
    # Dropout is secret too (keyed by batch position, which the secret sample decides): other
    # in every run, and not the public seed's key.
    seed_key = np.asarray(jax.random.PRNGKey(c.seed))
    key_a, key_b = (saved_dropout_key(tmp_path / name) for name in ("a", "b"))
    assert not np.array_equal(key_a, key_b)
    assert not np.array_equal(key_a, seed_key) and not np.array_equal(key_b, seed_key)
    # The config written to the workdir is the same; nothing in it derives the noise.
    assert (tmp_path / "a" / "config.json").read_text() == (tmp_path / "b" / "config.json"
                                                             ).read_text()


def test_resume_reuses_the_calibrated_sigma_and_the_budget_covers_it(cache_dir):
    """A calibrated run extended with more steps keeps its sigma (the first segment spent at
    that sigma) and the budget stops it; a larger target lets it go on at the same sigma."""
    c = small_config(cache_dir, **{"dp.noise_multiplier": None, "dp.target_epsilon": 2.0,
                                   "train.num_steps": 2, **UNTRUNCATED})
    first = plan_lib.from_config(c, 1000, 8)
    sigma, saved = first.noise_multiplier, first.ledger.to_json(2)
    assert first.ledger.epsilon(2) <= 2.0
    c.train.num_steps = 20
    spent = plan_lib.from_config(c, 1000, 8, saved_ledger=saved, start_step=2)
    assert spent.noise_multiplier == sigma and spent.num_steps == 2
    assert spent.ledger.epsilon(2) == first.ledger.epsilon(2)
    c.dp.target_epsilon = 3.0
    more = plan_lib.from_config(c, 1000, 8, saved_ledger=saved, start_step=2)
    assert more.noise_multiplier == sigma and 2 < more.num_steps < 20
    direct = lambda t: dp_lib.compute_epsilon(noise_multiplier=sigma, expected_batch_size=16,
                                              num_examples=1000, steps=t, delta=1e-4)
    assert more.ledger.epsilon(more.num_steps) == pytest.approx(direct(more.num_steps), rel=1e-12)
    assert direct(more.num_steps) <= 3.0 < direct(more.num_steps + 1)


def _composed(segments, delta=1e-4, n=1000, b=16):
    """dp_accounting's epsilon of Poisson segments [(sigma_eff, steps)], written here."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    event = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(b / n, dp_accounting.GaussianDpEvent(s)), t)
        for s, t in segments])
    return pld_privacy_accountant.PLDAccountant().compose(event).get_epsilon(delta)


def test_per_shard_resume_on_other_devices_composes_the_segments(cache_dir):
    c = small_config(cache_dir, **{"dp.noise_mode": "per_shard", "dp.target_epsilon": None,
                                   "train.num_steps": 30, **UNTRUNCATED})
    one = plan_lib.from_config(c, 1000, 1)
    saved = one.ledger.to_json(10)
    c.train.num_steps = 40
    eight = plan_lib.from_config(c, 1000, 8, saved_ledger=saved, start_step=10)
    assert [s.steps for s in eight.ledger.closed] == [10]
    expected = _composed([(1.0, 10), (8 ** 0.5, 30)])
    assert eight.ledger.epsilon(30) == pytest.approx(expected, rel=1e-9)
    assert eight.ledger.progress_epsilon(30) == pytest.approx(expected, rel=1e-6)
    # The budget counts the first segment too.
    c.dp.target_epsilon = (_composed([(1.0, 10), (8 ** 0.5, 20)]) +
                           _composed([(1.0, 10), (8 ** 0.5, 21)])) / 2
    capped = plan_lib.from_config(c, 1000, 8, saved_ledger=saved, start_step=10)
    assert capped.num_steps == 30
    # A ledger that does not match the checkpoint's step is refused.
    with pytest.raises(ConfigError, match="ledger covers 10 steps"):
        plan_lib.from_config(c, 1000, 8, saved_ledger=saved, start_step=12)


@pytest.mark.slow
def test_per_shard_resume_from_one_to_eight_devices_reports_the_composition(cache_dir,
                                                                           tmp_path):
    c = small_config(cache_dir, **{"dp.noise_mode": "per_shard", "train.num_steps": 1,
                                   "train.export_hf": False, "train.eval_every": 0,
                                   "checkpoint.every_steps": 1})
    train.train_and_evaluate(c, tmp_path / "run", devices=jax.devices()[:1])
    c.train.num_steps = 3
    report = train.train_and_evaluate(c, tmp_path / "run")
    t = report["training"]
    segments = t["segments"]
    assert [(s["spec"]["num_shards"], s["steps"]) for s in segments] == [(1, 1), (8, 2)]
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    n, m = t["num_examples"], t["max_batch_size"]
    event = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(
        dp_accounting.TruncatedSubsampledGaussianDpEvent(n, 16 / n, m, s), k)
        for s, k in ((1.0, 1), (8 ** 0.5, 2))])
    direct = pld_privacy_accountant.PLDAccountant().compose(event).get_epsilon(t["delta"])
    assert t["epsilon"] == pytest.approx(direct, rel=1e-9) and t["steps"] == 3


@pytest.mark.slow
def test_resume_on_changed_training_data_is_refused(cache_dir, tmp_path):
    from data_pipelines import synthetic_notes

    corpus = tmp_path / "notes.txt.gz"
    synthetic_notes.write_text_corpus(corpus, synthetic_notes.generate_synthetic(48, seed=3))
    c = small_config(cache_dir, **{"train.num_steps": 3, "train.export_hf": False,
                                   "train.eval_every": 0, "data.corpus": "text",
                                   "data.paths": (str(corpus),)})
    train.train_and_evaluate(c, tmp_path / "run")
    # Other notes in the same file: the config is unchanged, the data are not.
    synthetic_notes.write_text_corpus(corpus, synthetic_notes.generate_synthetic(48, seed=4))
    config_before = (tmp_path / "run" / "config.json").stat().st_mtime_ns
    with pytest.raises(ConfigError, match="training examples differ"):
        train.train_and_evaluate(c, tmp_path / "run")
    assert (tmp_path / "run" / "config.json").stat().st_mtime_ns == config_before
