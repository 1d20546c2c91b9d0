"""Secret-sharer exposure (dpbert.leakage.exposure): the statistic, the extrapolation, the model scoring
and the workdir pipeline on a hand-made workdir (no training; end to end: test_leakage.py)."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from configs import demo_dp
from data_pipelines import canaries, tokenization
from dpbert.runtime import checkpointing
from dpbert.leakage import exposure
from dpbert.models import bert as model_lib


def test_exposure_is_max_when_first_and_zero_when_last():
    scores = np.asarray([[3.0, 1.0, 2.0, 0.5], [0.0, 1.0, 2.0, 3.0]])
    ranks = exposure.secret_rank(scores, [0, 0])
    assert ranks.tolist() == [1, 4]
    np.testing.assert_allclose(exposure.exposure_from_rank(ranks, 4), [2.0, 0.0])
    # Ties are not counted against the secret (attacker-optimistic).
    assert exposure.secret_rank(np.zeros([1, 7]), [3]).tolist() == [1]
    with pytest.raises(ValueError, match="1..4"):
        exposure.exposure_from_rank(5, 4)


def test_random_logits_give_the_null_exposure():
    # The exact null mean: uniform rank on 1..n.
    for n in (2, 5, 37):
        direct = np.mean(math.log2(n) - np.log2(np.arange(1, n + 1)))
        assert exposure.null_exposure_mean(n) == pytest.approx(direct, rel=1e-12)
    assert exposure.null_exposure_mean(10_000) == pytest.approx(1.4419, abs=1e-4)
    # i.i.d. random logits over K canaries: mean within 1.4427 +- 4 * 1.44 / sqrt(K).
    rng = np.random.default_rng(0)
    k, n = 4000, 2000
    logits = rng.normal(size=[k, n])
    secret = rng.integers(0, n, size=k)
    e = exposure.exposure_from_rank(exposure.secret_rank(logits, secret), n)
    assert abs(e.mean() - 1 / math.log(2)) < 4 * 1.44 / math.sqrt(k)
    assert e.std() == pytest.approx(1.44, abs=0.1)


def test_skewnorm_extrapolation_is_exp_ln2_on_gaussian_scores():
    rng = np.random.default_rng(1)
    k, n = 120, 200
    ext = np.asarray([exposure.extrapolated_exposure(rng.normal(size=n), int(rng.integers(n)))
                      for _ in range(k)])
    # -log2 of a uniform: Exp(rate ln 2).
    assert stats.kstest(ext, stats.expon(scale=1 / math.log(2)).cdf).pvalue > 1e-3
    # It extrapolates beyond log2 |R| for a secret far below every candidate's loss, even
    # where scipy's logcdf underflows (the log-space tail integral takes over).
    losses = rng.normal(size=n)
    losses[7] = -8.0
    assert exposure.extrapolated_exposure(losses, 7) > math.log2(n) + 5
    losses[7] = -300.0
    assert math.isfinite(far := exposure.extrapolated_exposure(losses, 7)) and far > 1e4
    for z, a in [(-3.0, 5.0), (-20.0, -0.7), (-6.0, 1.0), (-2.0, 8.0)]:
        assert exposure.skewnorm_log_tail(z, a) == pytest.approx(
            stats.skewnorm.logcdf(z, a), abs=1e-3)


def test_secret_outside_r_or_special_is_an_error(notes_vocab):
    tok = tokenization.WordPieceTokenizer(notes_vocab)
    cs = canaries.make_canaries(tok, seed=0)
    r = canaries.secret_candidates(tok)
    exposure.check_candidates(r, tok.special, tok.vocab_size)
    assert exposure.secret_columns(cs, r, tok.special).tolist() == [
        r.tolist().index(c.secret_id) for c in cs]
    outside = dataclasses.replace(cs[0], secret_id=int(cs[0].token_ids[0] if cs[0].token_ids[0]
                                                       not in r else 6))
    with pytest.raises(ValueError, match="not in the candidate set"):
        exposure.secret_columns([outside], r[r != outside.secret_id], tok.special)
    special = dataclasses.replace(cs[0], secret_id=tok.special.mask)
    with pytest.raises(ValueError, match="special token"):
        exposure.secret_columns([special], np.append(r, tok.special.mask), tok.special)
    with pytest.raises(ValueError, match="special token ids"):
        exposure.check_candidates(np.append(r, tok.special.cls), tok.special, tok.vocab_size)


def random_params(config, seed=0):
    """Random parameters of a BertForPreTraining, drawn on the host (no init compile)."""
    abstract = nnx.eval_shape(lambda: model_lib.BertForPreTraining(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    rng = np.random.default_rng(seed)
    # BERT's init scale (LayerNorm scales at 1): logits of order 1.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (np.ones(x.shape, np.float32) if str(path[-1].key) == "scale" else
                         rng.normal(0, 0.02, x.shape).astype(np.float32)),
        nnx.to_pure_dict(state))
    return graphdef, params


@pytest.fixture(scope="module")
def tiny():
    config = model_lib.BertConfig.preset("tiny", 60, max_position_embeddings=16)
    return (config, *random_params(config, seed=3))


def test_scoring_is_the_mlm_at_the_masked_secret(tiny):
    _, graphdef, params = tiny
    special = tokenization.SpecialTokenIds(pad=0, unk=1, cls=2, sep=3, mask=4)
    mk = lambda cid, ids, pos, placement: canaries.Canary(
        cid, "HSH", [str(i) for i in ids], ids, str(ids[pos]), ids[pos], pos, 1,
        placement=placement)
    cs = [mk("a", [10, 11, 12], 1, "sentence"), mk("b", [20, 21, 22, 23, 24], 2, "example"),
          mk("c", [30, 31], 1, "example")]
    inputs = exposure.canary_inputs(cs, special, 10)
    assert inputs["input_ids"][0].tolist() == [2, 10, 4, 12, 3, 0, 0, 0, 0, 0]
    assert inputs["input_ids"][1].tolist() == [2, 20, 21, 4, 3, 23, 24, 3, 0, 0]
    assert inputs["segment_ids"][1].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert inputs["input_ids"][2].tolist()[:5] == [2, 30, 3, 4, 3]
    assert inputs["positions"][:, 0].tolist() == [2, 3, 3]
    # Two rows per call: the last call is padded.
    lp = exposure.masked_log_probs(graphdef, params, inputs, batch_size=2)

    @jax.jit
    def direct(p, x):
        out = nnx.merge(graphdef, p)(x["input_ids"], x["segment_ids"], x["input_mask"],
                                     x["positions"], deterministic=True)
        return jax.nn.log_softmax(out.mlm_logits[:, 0], axis=-1)

    np.testing.assert_allclose(lp, direct(params, inputs), atol=1e-5)


def fake_workdir(tmp_path, vocab_file, bias=20.0):
    """A workdir as launch/train.py leaves it (config.json, run.json, a checkpoint, the canary
    record in the data cache), holding a random tiny model whose MLM output bias is raised at
    the secret of the first canary planted 100 times: it must rank first ("memorized")."""
    tok = tokenization.WordPieceTokenizer(vocab_file)
    workdir = tmp_path / "run"
    config = demo_dp.get_config()
    config.model.size = "tiny"  # the checkpoint below is a tiny model
    config.data.canaries.enabled = True
    config.data.canaries.repetitions = (0, 10, 100)
    config.data.cache_dir = str(tmp_path / "cache")
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(config.to_dict(), default=str))
    cs = canaries.make_canaries(tok, repetitions=(0, 10, 100), canaries_per_setting=2, seed=1)
    canaries.write_canary_file(tmp_path / "cache" / "f1ng3r" / "canaries.json", cs, tok, seed=1,
                               extra={"data_fingerprint": "f1ng3r", "content_sha256": "c0nt"})
    mconf = model_lib.BertConfig.preset("tiny", tok.vocab_size, max_position_embeddings=16)
    _, params = random_params(mconf)
    b = np.array(params["cls"]["predictions"]["bias"])
    b[next(c for c in cs if c.repetitions == 100).secret_id] += bias
    params["cls"]["predictions"]["bias"] = b
    (workdir / "run.json").write_text(json.dumps({
        "model_config": dataclasses.asdict(mconf), "vocab_file": str(vocab_file),
        "do_lower_case": True, "max_seq_length": 16, "init_from_hf": None}))
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    # The checkpoint's data fingerprint is the content hash of the training examples.
    ckpt.save(7, {"params": params}, {"step": 7, "data_fingerprint": "c0nt"})
    ckpt.close()
    (workdir / "privacy_report.json").write_text(json.dumps(
        {"dp": True, "epsilon": 0.9, "delta": 1e-6, "privacy_unit": "example"}))
    return workdir, cs


def test_workdir_exposure_pipeline(tmp_path, notes_vocab):
    workdir, cs = fake_workdir(tmp_path, notes_vocab)
    res = exposure.evaluate_workdir(workdir)
    run = res["run"]
    n_r = run["num_candidates"]
    assert run["step"] == 7 and run["dp"] and run["epsilon"] == 0.9
    assert run["canary_file"].endswith("f1ng3r/canaries.json")
    assert run["max_exposure"] == pytest.approx(math.log2(n_r))
    rows = {r["canary_id"]: r for r in res["canaries"]}
    assert len(rows) == len(cs)
    for c in cs:
        row = rows[c.canary_id]
        assert row["form"] == c.form and row["repetitions"] == c.repetitions
    memorized = rows[next(c for c in cs if c.repetitions == 100).canary_id]
    assert memorized["rank"] == 1
    assert memorized["exposure"] == pytest.approx(math.log2(n_r))
    assert memorized["exposure_extrapolated"] > math.log2(n_r)
    summary = {(s["form"], s["repetitions"]): s for s in res["summary"]}
    assert len(summary) == 9 and all(s["n"] == 2 for s in summary.values())
    others = [r["exposure"] for r in rows.values() if r is not memorized]
    assert max(others) < math.log2(n_r) - 1
    assert exposure.plot([{**res, "label": "x"}], tmp_path / "e.png").stat().st_size > 1000
    # A record from other data is refused; a run without canaries is told so.
    with pytest.raises(ValueError, match="belongs to other training examples"):
        other = tmp_path / "other.json"
        tok = tokenization.WordPieceTokenizer(notes_vocab)
        canaries.write_canary_file(other, cs, tok, seed=1, extra={"content_sha256": "zzz"})
        exposure.evaluate_workdir(workdir, canary_file=other)
    config = json.loads((workdir / "config.json").read_text())
    config["data"]["canaries"]["enabled"] = False
    (workdir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="planted no canaries"):
        exposure.evaluate_workdir(workdir)


def test_the_canary_record_is_found_from_the_workdir(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    cache = tmp_path / "cache"
    config = demo_dp.get_config()
    config.data.canaries.enabled = True
    config.data.cache_dir = str(cache)

    def write(c):
        (workdir / "config.json").write_text(json.dumps(c.to_dict(), default=str))

    write(config)
    for entry in ("aaa", "bbb"):
        (cache / entry).mkdir(parents=True)
        (cache / entry / "canaries.json").write_text(json.dumps({"content_sha256": entry * 2}))
    # The record of the checkpoint's training examples (their content hash).
    assert exposure.find_canary_file(workdir, "bbbbbb") == cache / "bbb" / "canaries.json"
    with pytest.raises(FileNotFoundError, match="found 2"):
        exposure.find_canary_file(workdir, None)
    (cache / "aaa" / "canaries.json").unlink()
    assert exposure.find_canary_file(workdir, None) == cache / "bbb" / "canaries.json"
    # data.canaries.output_file wins.
    config.data.canaries.output_file = str(tmp_path / "out.json")
    (tmp_path / "out.json").write_text("{}")
    write(config)
    assert exposure.find_canary_file(workdir, "bbbbbb") == tmp_path / "out.json"
    # The trainer's default cache is WORKDIR/data/instances.
    config.data.canaries.output_file = ""
    config.data.cache_dir = ""
    write(config)
    (workdir / "data" / "instances" / "ccc").mkdir(parents=True)
    (workdir / "data" / "instances" / "ccc" / "canaries.json").write_text("{}")
    assert exposure.find_canary_file(workdir, "ccc").parent.name == "ccc"
    # A copy kept in the workdir comes first.
    (workdir / "canaries.json").write_text("{}")
    assert exposure.find_canary_file(workdir, "ccc") == workdir / "canaries.json"
