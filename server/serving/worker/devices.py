"""A worker's device, chosen before TensorFlow starts: its own GPU (with memory growth or a
fraction of the GPU's memory), or the CPU with the cores shared out between the workers."""

from __future__ import annotations

import logging

from ...config.server import ServerConfig

logger = logging.getLogger("bertserve.worker")


def configure_device(config: ServerConfig, index: int) -> str:
    """Pick this worker's device before TensorFlow starts; returns its TensorFlow name.

    GPU workers see only their own GPU (``CUDA_VISIBLE_DEVICES``), with memory growth or a
    memory fraction; CPU workers share the cores out so they do not fight over them.
    """
    from ...logs import held_native_output

    with held_native_output():  # TensorFlow's libraries log as they load
        import tensorflow as tf

    if not config.workers.cpu:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            ids = config.workers.device_map or tuple(range(len(gpus)))
            gpu_id = ids[index % len(ids)] % len(gpus)
            gpu = gpus[gpu_id]
            tf.config.set_visible_devices([gpu], "GPU")
            total_mb = _gpu_memory_mb(gpu_id) if config.workers.gpu_memory_fraction is not None else None
            if total_mb is None:
                tf.config.experimental.set_memory_growth(gpu, True)
            else:
                limit = int(total_mb * (config.workers.gpu_memory_fraction or 1.0))
                tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(limit)])
            return "/GPU:0"
        logger.info("no GPU visible: worker %d runs on the CPU", index)
    threads = config.worker_threads()
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    tf.config.set_visible_devices([], "GPU")
    return "/CPU:0"


def _gpu_memory_mb(gpu_id: int) -> int | None:
    """Total memory of a GPU in MiB, from nvidia-smi; None (use memory growth) if unknown."""
    import subprocess

    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", str(gpu_id)]
    try:
        return int(subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        logger.warning("cannot read GPU %d's memory with nvidia-smi; using memory growth instead", gpu_id)
        return None
