"""dpbert: differentially private BERT pretraining in JAX/Flax."""

import setuptools

INSTALL_REQUIRES = [
    # JAX 0.10.x is the newest line that supports Python 3.11; on Python >= 3.12 0.11.x runs
    # too (issue 32: jax 0.11.2 with CUDA 13 and flax 0.12.12 on one H100, end to end). This
    # pulls the CPU jaxlib; TPU/GPU users install their jaxlib variant (e.g. `jax[tpu]`,
    # `jax[cuda13]`) on top, in the same range.
    "jax>=0.10,<0.11; python_version < '3.12'",
    "jax>=0.10,<0.12; python_version >= '3.12'",
    "flax>=0.12,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12,<0.13",
    "ml-collections>=1.0,<2",
    "absl-py>=2.0,<3",
    "sentencepiece>=0.2,<0.3",
    "tokenizers>=0.21,<0.24",
    "safetensors>=0.4,<0.9",
    "dp-accounting>=0.6,<0.7",
    # The one-run audit's bounds (dpbert/leakage/audit_bounds.py) and the accounting
    # cross-check (tests/dpbert/dp/test_jax_privacy_accounting.py); 2.0.0 installs beside the
    # pins above (adds chex and toolz).
    "jax-privacy>=2.0,<2.1",
    "tensorflow-datasets>=4.9.8,<4.10",
    "grain>=0.2.12,<0.3",
    "numpy>=1.26,<3",
    "scipy>=1.11,<2",
    "tensorboardX>=2.6,<3",
    "tqdm>=4.66,<5",
    # Plots of launch/analyze_dchi.py (imported lazily).
    "matplotlib>=3.8,<4",
]

# Loading an export with Hugging Face transformers (`pip install -e ".[hf]"`).
HF_REQUIRES = [
    # Exactly this version: a CPU wheel of it lies on the build machines' disk; any
    # other torch requirement resolves to a multi-GB CUDA build.
    "torch==2.13.0",
    "transformers>=5,<6",
]

TEST_REQUIRES = [
    "pytest>=8,<10",
    # Two test workers (pytest.ini): the suite's wall time on 2 cores (21 -> 15 min).
    "pytest-xdist>=3.5,<4",
    # A stuck test prints its stacks and fails instead of holding the run (pytest.ini).
    "pytest-timeout>=2.3,<3",
    # transformers is the client that must load our exports.
    *HF_REQUIRES,
    # The reference implementation the entity-level F1 of data_pipelines.ner_metrics is tested against.
    "seqeval>=1.2.2,<1.3",
]

setuptools.setup(
    name="dpbert",
    version="0.1.0",
    description="Differentially private BERT pretraining in JAX/Flax",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["dpbert", "dpbert.*", "data_pipelines", "data_pipelines.*", "configs"]),
    install_requires=INSTALL_REQUIRES,
    extras_require={"hf": HF_REQUIRES, "test": TEST_REQUIRES},
)
