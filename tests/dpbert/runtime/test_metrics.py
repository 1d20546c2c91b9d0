"""dpbert.runtime.metrics: the TensorBoard and JSON-lines writer."""

import json
import pathlib
import subprocess
import sys
import textwrap

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_the_writer_writes_events_and_json_lines_without_loading_pytorch(tmp_path):
    """A fresh process (as a launcher is): the scalars reach metrics.jsonl and a TensorBoard
    event file, PyTorch is not imported for it, and an import of torch afterwards works."""
    script = textwrap.dedent(f"""
        import json, pathlib, sys
        from dpbert.runtime import metrics
        w = metrics.MetricWriter({str(tmp_path)!r}, enabled=True)
        w.write(3, {{"loss": 1.5, "skipped": None}})
        w.close()
        loaded = "torch" in sys.modules
        import torch  # noqa: F401  (still importable: the block was only for tensorboardX)
        print(json.dumps({{"torch_loaded_by_writer": loaded, "torch_ok": bool(torch.ones(1))}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True, env={"PYTHONPATH": str(REPO_ROOT),
                                                     "JAX_PLATFORMS": "cpu"})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"torch_loaded_by_writer": False, "torch_ok": True}
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"step": 3, "loss": 1.5}]
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    assert b"loss" in events[0].read_bytes()
