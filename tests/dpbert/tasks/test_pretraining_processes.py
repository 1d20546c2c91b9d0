"""The pretraining loop across devices and processes, and through kills and SIGTERM: 8 devices
= 1, two processes of 4 = one of 8, the ghost clipper = vmap on a mesh, kill/SIGTERM + resume =
uninterrupted, SIGTERM under load. (Split from test_pretraining.py so the two pytest-xdist
workers share the slowest end-to-end tests.)"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import pytest

from dpbert.dp import trees
from dpbert.tasks import pretraining as train
from tests.dpbert.tasks.test_pretraining import (  # noqa: F401  (cache_dir: the fixture)
    REPO, assert_trees, cache_dir, cli_train_args, final_params, override, run_cli,
    small_config)


@pytest.fixture(scope="module")
def eight_devices(cache_dir, tmp_path_factory):
    """The 3-step small run on all 8 devices (seeded: every run of it is the same run), which
    the one-device, fsdp and two-process runs are compared with (read only)."""
    workdir = tmp_path_factory.mktemp("eight") / "run"
    train.train_and_evaluate(
        small_config(cache_dir, **{"train.num_steps": 3, "train.export_hf": False}), workdir)
    return workdir


@pytest.mark.slow
def test_eight_devices_equal_one_device(cache_dir, eight_devices, tmp_path):
    c = small_config(cache_dir, **{"train.num_steps": 3, "train.export_hf": False})
    train.train_and_evaluate(c, tmp_path / "one", devices=jax.devices()[:1])
    c2 = small_config(cache_dir, **{"train.num_steps": 3, "train.export_hf": False,
                                    "mesh.data": 4, "mesh.fsdp": 2})
    train.train_and_evaluate(c2, tmp_path / "fsdp")
    one, _ = final_params(tmp_path / "one")
    eight, _ = final_params(eight_devices)
    fsdp, _ = final_params(tmp_path / "fsdp")
    assert_trees(one, eight, exact=False, rtol=2e-4, atol=2e-6)
    assert_trees(one, fsdp, exact=False, rtol=2e-4, atol=2e-6)


@pytest.mark.slow
def test_ghost_embedding_clipping_equals_vmap_clipping(cache_dir, tmp_path):
    """dp.clipping only changes how the clipped sum is computed, not the training run."""
    runs = {}
    for clipping in ("vmap", "ghost_embedding", "mixed_ghost"):
        c = small_config(cache_dir, **{"train.num_steps": 3, "train.export_hf": False,
                                       "train.eval_every": 0, "checkpoint.every_steps": 0,
                                       "dp.clipping": clipping})
        # One device keeps this test short; the clippers' equality on a (data, fsdp) mesh is
        # tested in tests/dpbert/dp/test_ghost.py.
        train.train_and_evaluate(c, tmp_path / clipping, devices=jax.devices()[:1])
        runs[clipping], step = final_params(tmp_path / clipping)
        assert step == 3
    for clipping in ("ghost_embedding", "mixed_ghost"):
        assert_trees(runs[clipping], runs["vmap"], exact=False, rtol=2e-4, atol=2e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_process_of_eight(cache_dir, eight_devices,
                                                                   tmp_path):
    port = _free_port()
    env_flags = "--xla_force_host_platform_device_count=4"
    procs = []
    for pid in range(2):
        args = cli_train_args(tmp_path / "multi", cache_dir,
                              ["--config.train.num_steps=3", "--config.train.export_hf=False",
                               f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                               f"--process_id={pid}"])
        env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS=env_flags)
        procs.append(subprocess.Popen([sys.executable, *map(str, args)], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    single, _ = final_params(eight_devices)
    multi, _ = final_params(tmp_path / "multi")
    assert_trees(single, multi, exact=False, rtol=2e-4, atol=2e-6)


def _wait_for_checkpoint(workdir: pathlib.Path, proc, min_step: int, timeout=300):
    deadline = time.time() + timeout
    ckpts = workdir / "checkpoints"
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.stdout.read()[-3000:]}")
        names = [p.name for p in ckpts.iterdir()] if ckpts.is_dir() else []
        # A step folder is complete once orbax renamed it from its temporary name.
        if any(n.isdigit() and int(n) >= min_step for n in names) and \
                not any("tmp" in n for n in names):
            return
        time.sleep(0.2)
    raise AssertionError("no checkpoint appeared in time")


@pytest.mark.slow
def test_kill_and_sigterm_then_resume_equal_uninterrupted(cache_dir, tmp_path):
    """Secret noise and sampling (the default): a run killed with -9, resumed, stopped with
    Ctrl-C and resumed again ends bitwise equal to its twin, which continued without
    interruption from the same checkpoint (the only way two runs share secrets)."""
    overrides = {"train.num_steps": 8, "checkpoint.every_steps": 3, "train.export_hf": False,
                 "checkpoint.max_to_keep": 5}
    flags = ["--config.dp.insecure_seeded_noise=False"] + [
        f"--config.{k}={v}" for k, v in overrides.items()]
    resumed, twin = tmp_path / "resumed", tmp_path / "twin"
    # 1) kill -9 after the step-3 checkpoint is complete; the twin branches off here.
    proc = run_cli(*cli_train_args(resumed, cache_dir, flags))
    _wait_for_checkpoint(resumed, proc, 3)
    proc.kill()
    proc.wait()
    shutil.copytree(resumed, twin)
    train.train_and_evaluate(small_config(cache_dir, **overrides,
                                          **{"dp.insecure_seeded_noise": False}), twin)
    # 2) resume; Ctrl-C (SIGINT; SIGTERM takes the same path) after the step-6 checkpoint:
    # saves the current step and exits 130.
    proc = run_cli(*cli_train_args(resumed, cache_dir, flags))
    _wait_for_checkpoint(resumed, proc, 6)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode in (0, 130), out[-3000:]
    # 3) resume to the end.
    proc = run_cli(*cli_train_args(resumed, cache_dir, flags))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    # Step 6 first (both saved it: the twin on its way, the resumed run before Ctrl-C), so a
    # failure says in which stretch the two parted.
    for step in (6, 8):
        a, step_a = final_params(twin, step)
        b, step_b = final_params(resumed, step)
        assert step_a == step_b == step
        try:
            assert_trees(a, b, exact=True)
        except AssertionError as e:
            raise AssertionError(f"the resumed run and its twin differ at step {step}") from e
    assert final_params(twin)[1] == final_params(resumed)[1] == 8
    report = json.loads((resumed / "privacy_report.json").read_text())
    assert report["training"]["secret_randomness"] is True


@pytest.mark.slow
def test_sigterm_under_load_says_saved_only_once_it_is_and_the_rerun_resumes_there(cache_dir,
                                                                                   tmp_path):
    """Issue 35: under heavy load a run printed 'stopped by SIGTERM: checkpoint saved at step
    N', yet its checkpoint folder held only N.orbax-checkpoint-tmp and the rerun started from
    step 0 (the message came before the asynchronous save was done; a supervisor's SIGKILL
    right after it lost the save). A CPU hog loads the machine, SIGTERM arrives during the
    run, and the process is killed the moment it says 'saved': the step must be on disk and
    the rerun must resume from it."""
    import re  # noqa: PLC0415

    workdir = tmp_path / "w"
    overrides = {"train.num_steps": 400, "train.log_every": 1, "train.eval_every": 0,
                 "checkpoint.every_steps": 0, "checkpoint.async_save": True,
                 "train.export_hf": False}
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    lines = []
    try:
        proc = subprocess.Popen([sys.executable, *map(str, cli_train_args(workdir, cache_dir,
                                                                          flags))],
                                cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 2/"):
                proc.send_signal(signal.SIGTERM)
            if "stopped by SIGTERM" in line:
                proc.kill()  # what a supervisor does when its grace period is over
                break
        proc.wait(timeout=300)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    out = "".join(lines)
    assert f"no checkpoint in {workdir / 'checkpoints'}: starting fresh at step 0" in out, out
    m = re.search(r"stopped by SIGTERM: checkpoint of step (\d+) saved", out)
    assert m, out[-3000:]
    step = int(m.group(1))
    assert step >= 2
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == [str(step)]
    # The rerun resumes at that step (one more step, then done).
    rerun = run_cli(*cli_train_args(workdir, cache_dir,
                                    flags + [f"--config.train.num_steps={step + 1}"]))
    text, _ = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, text[-3000:]
    assert f"resumed from {workdir / 'checkpoints' / str(step)} at step {step}" in text
    assert final_params(workdir)[1] == step + 1


