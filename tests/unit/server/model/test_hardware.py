"""``--dtype auto``: the CPU's flags read, the dtype chosen from them, and resolved options
that say what was chosen and why. No TensorFlow: the head decides as the workers do."""

from __future__ import annotations

import pytest
from bertserve.server import ModelConfig
from bertserve.server.cli import main as cli
from bertserve.server.errors import ModelOptionError
from bertserve.server.model import hardware
from bertserve.server.model.graph import cache_key
from bertserve.server.model.model_dir import inspect_model
from bertserve.server.model.options import describe, resolve

_COMMON = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall "
    "nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid pni pclmulqdq ssse3 fma cx16 "
    "pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch "
    "bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves"
)
XEON_AMX = f"""processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8488C
stepping\t: 8
flags\t\t: {_COMMON} avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16 wbnoinvd ida arat \
avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes vpclmulqdq avx512_bitalg tme avx512_vpopcntdq rdpid \
cldemote movdiri movdir64b md_clear serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d \
arch_capabilities
bogomips\t: 4800.00

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: {_COMMON} amx_bf16
"""
EPYC_BF16 = f"""processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: {_COMMON} avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 clzero xsaveerptr \
rdpru wbnoinvd arat avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
avx512_vpopcntdq rdpid fsrm
"""
EPYC_AVX2 = f"""processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7R13 Processor
flags\t\t: {_COMMON} clzero xsaveerptr rdpru wbnoinvd arat npt nrip_save vaes vpclmulqdq rdpid
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
CPU implementer\t: 0x41
"""


def test_cpuinfo_is_read_for_the_model_and_flags() -> None:
    xeon = hardware.parse_cpuinfo(XEON_AMX)
    assert xeon.model == "Intel(R) Xeon(R) Platinum 8488C"
    assert xeon.flags is not None and {"amx_bf16", "avx512_bf16", "avx2"} <= xeon.flags
    assert "bogomips" not in xeon.flags and "processor" not in xeon.flags
    epyc = hardware.parse_cpuinfo(EPYC_AVX2)
    assert epyc.model == "AMD EPYC 7R13 Processor"
    assert epyc.flags is not None and "avx2" in epyc.flags and not epyc.flags & set(hardware.BF16_FLAGS)
    arm = hardware.parse_cpuinfo(ARM)
    assert (arm.model, "asimd" in (arm.flags or ())) == (hardware.UNKNOWN, True)
    assert hardware.parse_cpuinfo("") == hardware.CpuInfo(model="unknown", flags=None)
    assert hardware._read_cpuinfo.__wrapped__("/no/such/cpuinfo") == hardware.CpuInfo()  # not Linux


def test_a_cpu_with_bf16_matrix_instructions_gets_bf16() -> None:
    dtype, reason = hardware.choose_dtype(hardware.parse_cpuinfo(XEON_AMX).flags, on_gpu=False)
    assert dtype == "bf16"
    assert reason.startswith("bf16: this CPU has AMX (amx_bf16);") and "0.999" in reason
    dtype, reason = hardware.choose_dtype(hardware.parse_cpuinfo(EPYC_BF16).flags, on_gpu=False)
    assert (dtype, hardware.short_reason(reason)) == ("bf16", "this CPU has AVX-512 bf16 (avx512_bf16)")


def test_any_other_cpu_gets_fp32_and_is_told_why() -> None:
    dtype, reason = hardware.choose_dtype(hardware.parse_cpuinfo(EPYC_AVX2).flags, on_gpu=False)
    assert dtype == "fp32"
    assert "no bf16 matrix instructions" in reason and "amx_bf16 or avx512_bf16" in reason
    assert hardware.short_reason(reason) == "this CPU has no bf16 matrix instructions"
    assert hardware.choose_dtype(hardware.parse_cpuinfo(ARM).flags, on_gpu=False)[0] == "fp32"
    dtype, reason = hardware.choose_dtype(None, on_gpu=False)
    assert dtype == "fp32" and "unknown" in reason


def test_a_gpu_gets_fp16_whatever_the_cpu() -> None:
    assert hardware.on_gpu("/GPU:0") and hardware.on_gpu("/device:GPU:1")
    assert not hardware.on_gpu("/CPU:0") and not hardware.on_gpu(None) and not hardware.on_gpu("cpu")
    for flags in (None, frozenset({"amx_bf16"})):
        dtype, reason = hardware.choose_dtype(flags, on_gpu=True)
        assert dtype == "fp16" and "GPU" in reason
    assert hardware.resolve_dtype("auto", "/GPU:0")[0] == "fp16"


def test_the_environment_stands_in_for_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FLAGS_ENV, "avx2, fma avx512_bf16")
    assert hardware.cpu().flags == {"avx2", "fma", "avx512_bf16"}
    assert hardware.resolve_dtype("auto", None)[0] == "bf16"
    monkeypatch.setenv(hardware.FLAGS_ENV, "avx2 fma")
    assert hardware.resolve_dtype("auto", "/CPU:0")[0] == "fp32"


def test_a_dtype_asked_for_is_kept_and_auto_never_picks_int8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FLAGS_ENV, "avx2 fma amx_bf16")
    assert hardware.resolve_dtype("bf16", None) == ("bf16", hardware.ASKED)
    monkeypatch.setenv(hardware.FLAGS_ENV, "avx2 fma")  # an EPYC of AVX2 only: kept, and said to be emulated
    dtype, reason = hardware.resolve_dtype("bf16", None)
    assert dtype == "bf16" and reason.startswith(hardware.ASKED) and "bf16 is emulated here" in reason
    assert hardware.resolve_dtype("bf16", "/GPU:0") == ("bf16", hardware.ASKED)
    assert hardware.resolve_dtype("int8", "/GPU:0") == ("int8", hardware.ASKED)
    for text in (XEON_AMX, EPYC_BF16, EPYC_AVX2, ARM, ""):
        for gpu in (False, True):
            assert hardware.choose_dtype(hardware.parse_cpuinfo(text).flags, gpu)[0] in ("fp32", "bf16", "fp16")
    monkeypatch.setenv(hardware.FLAGS_ENV, "amx_int8 avx512_vnni avx_vnni")  # int8 instructions
    assert hardware.resolve_dtype("auto", None)[0] == "fp32"


def test_model_config_takes_auto_and_int8() -> None:
    assert ModelConfig.of(model_dir="/m").dtype == "auto"
    assert ModelConfig.of(model_dir="/m", dtype="AUTO").dtype == "auto"
    assert ModelConfig.of(model_dir="/m", dtype="qint8").dtype == "int8"
    assert ModelConfig.of(model_dir="/m", dtype="int8").dtype == "int8"
    with pytest.raises(ModelOptionError, match="unknown dtype 'int4'; choose auto, fp32, bf16, fp16 or int8"):
        ModelConfig.of(model_dir="/m", dtype="int4")


@pytest.mark.parametrize(("cpuinfo", "dtype"), [(XEON_AMX, "bf16"), (EPYC_BF16, "bf16"), (EPYC_AVX2, "fp32")])
def test_resolve_turns_auto_into_the_cpus_dtype(
    tiny_hf: str, monkeypatch: pytest.MonkeyPatch, cpuinfo: str, dtype: str
) -> None:
    monkeypatch.delenv(hardware.FLAGS_ENV, raising=False)
    monkeypatch.setattr(hardware, "_read_cpuinfo", lambda: hardware.parse_cpuinfo(cpuinfo))
    requested = ModelConfig.of(model_dir=tiny_hf)
    config, spec = resolve(requested, inspect_model(requested))
    assert spec.dtype == dtype  # the graph, and its cache key, are the concrete dtype's
    info = describe(config, spec)
    assert (info["dtype"], info["dtype_requested"]) == (dtype, "auto")
    assert info["dtype_reason"] == hardware.choose_dtype(hardware.parse_cpuinfo(cpuinfo).flags, False)[1]
    on_gpu = requested.replace(device="/GPU:0")
    config, spec = resolve(on_gpu, inspect_model(on_gpu))
    assert (spec.dtype, describe(config, spec)["dtype"]) == ("fp16", "fp16")


def test_autos_bf16_is_the_graph_the_reference_tests_hold(tiny_hf: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FLAGS_ENV, "avx2 amx_tile amx_bf16")
    specs = {}
    for dtype in ("auto", "bf16"):
        requested = ModelConfig.of(model_dir=tiny_hf, dtype=dtype)
        model = inspect_model(requested)
        specs[dtype] = (resolve(requested, model)[1], cache_key(model, resolve(requested, model)[1]))
    assert specs["auto"] == specs["bf16"]  # the same spec, so the same cached graph


def test_a_dtype_asked_for_is_described_as_asked(tiny_hf: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hardware.FLAGS_ENV, "avx512f avx512_bf16")  # a CPU of bf16 instructions: nothing to add
    requested = ModelConfig.of(model_dir=tiny_hf, dtype="bfloat16")
    config, spec = resolve(requested, inspect_model(requested))
    info = describe(config, spec)
    assert (spec.dtype, info["dtype"], info["dtype_requested"], info["dtype_reason"]) == (
        "bf16",
        "bf16",
        "bf16",
        "asked for with --dtype",
    )


def test_the_ready_line_says_what_auto_chose_and_why() -> None:
    _, reason = hardware.choose_dtype(hardware.parse_cpuinfo(EPYC_AVX2).flags, on_gpu=False)
    info = {"dtype": "fp32", "dtype_requested": "auto", "dtype_reason": reason}
    assert cli.dtype_text(info) == "fp32 (auto: this CPU has no bf16 matrix instructions)"
    assert cli.dtype_text({"dtype": "bf16", "dtype_requested": "bf16", "dtype_reason": hardware.ASKED}) == "bf16"
    assert cli.dtype_text({"dtype": "fp16"}) == "fp16"  # a model class that says no more
    assert cli.dtype_text({"dtype": "auto"}).startswith("auto (each worker decides")


def test_the_ready_line_says_which_runs_auto_gives_to_litert() -> None:
    _, reason = hardware.choose_dtype({"amx_bf16", "avx512f"}, on_gpu=False)
    info = {
        "dtype": "bf16",
        "dtype_requested": "auto",
        "dtype_reason": reason,
        "lite_max_tokens": 64,
        "small_run_dtype": "fp32",
    }
    assert cli.dtype_text(info) == "bf16 (auto: this CPU has AMX (amx_bf16); runs of up to 64 tokens in fp32 on LiteRT)"


def test_int8_says_what_the_cpu_makes_of_it(monkeypatch) -> None:
    monkeypatch.setenv("BERTSERVE_CPU_FLAGS", "avx2 fma")
    dtype, reason = hardware.resolve_dtype("int8", None)
    assert dtype == "int8" and reason.startswith(hardware.ASKED)
    assert "no int8 matrix instructions" in reason and "no faster than fp32" in reason
    monkeypatch.setenv("BERTSERVE_CPU_FLAGS", "avx512f avx512_vnni amx_int8 amx_bf16")
    reason = hardware.resolve_dtype("int8", None)[1]
    assert "AMX-int8 and AVX-512 VNNI, which LiteRT's int8 kernels use" in reason and "AMX (amx_bf16)" not in reason
    assert "it has AMX too" in reason
