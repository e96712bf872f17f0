"""The CONFIG command's options (``ServerConfig.public``): one key a flag and model option,
the same keys and values whatever parts the config is built from, since clients read them."""

from __future__ import annotations

from bertserve.server.cli import flags, main as cli
from bertserve.server.config.server import ServerConfig

KEYS = (
    "allow_terminate",
    "api_key",
    "api_keys",
    "auto_truncate",
    "batch_size",
    "bind",
    "bulk_run_ms",
    "bulk_slowdown",
    "calibration",
    "chunk_stride",
    "ckpt_name",
    "config_name",
    "cors_allow_origin",
    "cpu",
    "curve_dir",
    "default_model",
    "default_prompt_name",
    "device",
    "device_map",
    "do_lower_case",
    "dtype",
    "feed",
    "forwarded_allow_ips",
    "gpu_memory_fraction",
    "graph_dir",
    "grpc_bind",
    "grpc_idle_timeout_s",
    "grpc_port",
    "grpc_tls_cert",
    "grpc_tls_client_ca",
    "grpc_tls_key",
    "heartbeat_timeout_ms",
    "http_bind",
    "http_body_min_rate",
    "http_body_timeout_s",
    "http_header_timeout_s",
    "http_port",
    "instruction",
    "job_timeout_ms",
    "keep_versions",
    "legacy_clients",
    "lite_max_tokens",
    "long_inputs",
    "mask_cls_sep",
    "max_batch_size",
    "max_batch_tokens",
    "max_client_queued_sentences",
    "max_grpc_calls",
    "max_grpc_calls_per_principal",
    "max_grpc_message_bytes",
    "max_grpc_streams",
    "max_http_body_bytes",
    "max_http_body_bytes_per_principal",
    "max_http_body_bytes_total",
    "max_http_connections",
    "max_http_header_bytes",
    "max_http_headers",
    "max_latency_ms",
    "max_message_bytes",
    "max_queued_bytes",
    "max_queued_sentences",
    "max_reply_bytes",
    "max_request_size",
    "max_request_tokens",
    "max_restarts",
    "max_seq_len",
    "max_text_chars",
    "merge_requests",
    "metrics_port",
    "metrics_principals",
    "model_alias",
    "model_cache",
    "model_class",
    "model_commit",
    "model_defaults",
    "model_dir",
    "model_id",
    "model_revision",
    "model_url",
    "model_version",
    "models",
    "models_dir",
    "normalize",
    "num_worker",
    "output_dtype",
    "poll_interval_s",
    "pooling_layer",
    "pooling_strategy",
    "port",
    "port_out",
    "prefetch_size",
    "prompt",
    "reply_hwm",
    "request_timeout_ms",
    "require_manifest",
    "served_model_name",
    "show_tokens_to_client",
    "stop_timeout",
    "sync_max_bytes_per_s",
    "task",
    "task_defaults",
    "threads_per_worker",
    "token_id_input",
    "tuned_model_dir",
    "vocab_name",
    "worker_nice",
    "worker_port",
    "xla",
)
"""Every key CONFIG has always had: the flags, and the default model's options."""


def _start(argv: list[str]) -> ServerConfig:
    return flags.server_config_from_args(cli.build_parser().parse_args(["start", *argv]))


def test_one_model_gives_every_key_with_its_flags_values() -> None:
    config = _start(["--model-dir", "/m/one", "--http-port", "8080", "--prompt", "q=query: "])
    public = config.public()
    assert tuple(sorted(public)) == KEYS
    assert (public["http_port"], public["prompt"], public["port_out"], public["served_model_name"]) == (
        8080,
        ("q=query: ",),
        5556,
        None,
    )
    (role,) = config.model_configs()
    assert tuple(sorted(role.public())) == KEYS and role.public()["served_model_name"] == "one"


def test_several_models_give_the_flags_and_the_default_models_options() -> None:
    argv = ["--model", "fast=/m/a,dtype=int8,num_worker=2", "--model", "big=/m/b", "--dtype", "bf16"]
    config = _start([*argv, "--default-model", "big", "--num-worker", "3"])
    public = config.public()
    assert tuple(sorted(public)) == KEYS
    assert (public["num_worker"], public["models"], public["default_model"], public["served_model_name"]) == (
        3,
        ("fast=/m/a,dtype=int8,num_worker=2", "big=/m/b"),
        "big",
        None,
    )
    assert (public["model_dir"], public["dtype"], public["model_version"], public["task_defaults"]) == (
        "/m/b",
        "bf16",
        "latest",
        (),
    )
    assert (public["model_defaults"]["model_dir"], public["model_defaults"]["dtype"]) == ("/m/b", "bf16")
    assert set(public["model_defaults"]) == {key for key in KEYS if key in public["model_defaults"]}
    roles = [role.public() for role in config.model_configs()]
    assert [tuple(sorted(role)) for role in roles] == [KEYS, KEYS]
    assert [
        (role["served_model_name"], role["num_worker"], role["model_dir"], role["dtype"], role["models"])
        for role in roles
    ] == [("fast", 2, "/m/a", "int8", ()), ("big", 3, "/m/b", "bf16", ())]
    assert all(role["model_defaults"] is None and role["default_model"] is None for role in roles)
