"""The dtypes the weights are stored in and the matrix products run in, by dtype name."""

from __future__ import annotations

from typing import Any

import numpy as np


def numpy_dtype(dtype: str) -> np.dtype:
    if dtype == "bf16":
        import tensorflow as tf

        return tf.bfloat16.as_numpy_dtype
    return np.dtype({"fp32": np.float32, "fp16": np.float16, "int8": np.float32}[dtype])


def compute_dtype(dtype: str) -> Any:
    import tensorflow as tf

    # int8's graph is fp32: its LiteRT form (see .int8) holds the int8 weights.
    return {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16, "int8": tf.float32}[dtype]
