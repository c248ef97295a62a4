"""The variant table (fastattn/_variants.py), the target choice setup.py makes from it,
CPU feature detection and the dispatcher's choice."""
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastattn import _dispatch, _variants
from fastattn._kernels import _cpu

ROOT = Path(__file__).resolve().parents[1]
ISA_DIR = ROOT / "fastattn" / "_kernels" / "isa"
# the headers are sources: present in a checkout or an sdist, not in an installed wheel
# (tools/check_wheel.sh runs these tests from a copy of tests/ against the wheel)
HAVE_SOURCES = (ROOT / "setup.py").is_file() and ISA_DIR.is_dir()


# ---------------------------------------------------------------- the table

@pytest.mark.parametrize("arch", sorted(_variants.VARIANTS) + [None])
def test_table_is_consistent(arch):
    table = _variants.variants_for(arch)
    names = [v.name for v in table]
    assert names[0] == "baseline", "the first variant of an architecture must run on every CPU of it"
    assert len(set(names)) == len(names)
    for v in table:
        if HAVE_SOURCES:
            assert (ISA_DIR / v.header).is_file(), f"{v.name}: missing header isa/{v.header}"
        assert not any("native" in f or "fast-math" in f for f in v.flags), v.flags
        assert v.description
    # each variant needs at least what the one before it needs (best last)
    for a, b in zip(table[1:], table[2:]):
        assert set(a.requires) <= set(b.requires), (a.name, b.name)


def test_every_required_feature_is_detected():
    # a requirement _cpu cannot report would make its variant unreachable
    for arch, table in _variants.VARIANTS.items():
        for v in table:
            missing = set(v.requires) - set(_cpu.FEATURES[arch])
            assert not missing, f"{v.name} requires {missing}, which _cpu.pyx does not detect"


@pytest.mark.parametrize("tag, arch", [
    ("linux-x86_64", "x86_64"), ("linux-aarch64", "aarch64"), ("macosx-11.0-arm64", "aarch64"),
    ("macosx-10.9-x86_64", "x86_64"), ("win-amd64", "x86_64"), ("win-arm64", "aarch64"),
    ("mingw_x86_64_ucrt", "x86_64"), ("mingw_x86_64", "x86_64"), ("aarch64-linux-gnu", "aarch64"),
    ("x86_64-w64-mingw32", "x86_64"), ("AMD64", "x86_64"), ("arm64", "aarch64"),
    ("linux-ppc64le", None), ("linux-i686", None), ("linux-s390x", None), ("macosx-10.9-universal2", None),
])
def test_arch_of(tag, arch):
    assert _variants.arch_of(tag) == arch


def test_target_is_the_platform_not_the_host():
    # what setup.py builds: the cross recipe sets _PYTHON_HOST_PLATFORM, so the
    # sysconfig platform names the target while platform.machine() names the host
    assert _variants.target_arch("linux-aarch64", "", "x86_64") == ("aarch64", None)
    assert _variants.target_arch("macosx-11.0-arm64", "", "x86_64") == ("aarch64", None)
    assert _variants.target_arch("win-amd64", "", "ARM64") == ("x86_64", None)
    assert [v.name for v in _variants.variants_for("aarch64")] == ["baseline", "neon", "neon_bf16"]
    assert [v.name for v in _variants.variants_for(None)] == ["baseline"]


def test_universal2_builds_one_architecture():
    assert _variants.target_arch("macosx-10.9-universal2", "-arch arm64", "x86_64") == ("aarch64", None)
    assert _variants.target_arch("macosx-10.9-universal2", "", "arm64") == ("aarch64", "-arch arm64")
    assert _variants.target_arch("macosx-10.9-universal2", "", "x86_64") == ("x86_64", "-arch x86_64")
    with pytest.raises(SystemExit, match="one wheel per -arch"):
        _variants.target_arch("macosx-10.9-universal2", "-arch arm64 -arch x86_64", "x86_64")


def test_amx_variant_built_for_linux_only():
    names = lambda tag: [v.name for v in _variants.variants_to_build("x86_64", tag)]
    assert names("linux-x86_64")[-1] == "avx512_amx"
    for tag in ("win-amd64", "mingw_x86_64_ucrt", "macosx-11.0-x86_64"):
        assert "avx512_amx" not in names(tag) and names(tag)[-1] == "avx512_bf16"
    assert _variants.variants_to_build("aarch64", "linux-aarch64") == _variants.variants_for("aarch64")


def test_supported_honours_features_and_vendors():
    x86 = dict.fromkeys(_cpu.FEATURES["x86_64"], True)
    can, auto = _variants.supported("x86_64", x86, "GenuineIntel")
    assert can == ["baseline", "avx2", "avx512", "avx512_bf16", "avx512_amx"]
    assert auto == ["baseline", "avx2", "avx512", "avx512_amx"]
    no_amx = dict(x86, amx_bf16=False)   # Zen 4 / 5, Ice Lake, or a kernel that refused the tile state
    assert _variants.supported("x86_64", no_amx, "GenuineIntel")[1][-1] == "avx512"
    assert _variants.supported("x86_64", no_amx, "AuthenticAMD")[1][-1] == "avx512_bf16"
    assert _variants.supported("x86_64", x86, "AuthenticAMD")[1][-1] == "avx512_amx"
    no_bf16 = dict(x86, avx512bf16=False)
    assert _variants.supported("x86_64", no_bf16, "AuthenticAMD")[0][-1] == "avx512"
    no_zmm = dict(x86, avx512f=False)   # e.g. the OS does not save the ZMM state
    assert _variants.supported("x86_64", no_zmm, "")[0] == ["baseline", "avx2"]
    a72 = {"asimd": True}
    assert _variants.supported("aarch64", a72, "")[0] == ["baseline", "neon"]
    v1 = dict.fromkeys(_cpu.FEATURES["aarch64"], True)
    assert _variants.supported("aarch64", v1, "")[1] == ["baseline", "neon", "neon_bf16"]
    n1 = {"asimd": True, "asimdhp": True, "asimddp": True}   # ARMv8.2 without BF16
    assert _variants.supported("aarch64", n1, "")[0][-1] == "neon"


# ---------------------------------------------------------------- this machine

def test_this_build_matches_the_table():
    arch = _cpu.target_arch()
    assert arch in ("x86_64", "aarch64", "other")
    if arch != "other":
        assert _variants.arch_of(platform.machine()) == arch
    assert _dispatch.ALL_VARIANTS == tuple(v.name for v in _variants.variants_for(None if arch == "other" else arch))
    assert _dispatch.VARIANT in _dispatch.available_variants()
    assert set(_cpu.cpu_features()) == set(_cpu.FEATURES.get(arch, ()))


@pytest.mark.skipif(not (sys.platform.startswith("linux") and _cpu.target_arch() == "x86_64"),
                    reason="compares CPUID with Linux's /proc/cpuinfo flags (x86-64 Linux)")
def test_x86_features_agree_with_the_kernel():
    text = Path("/proc/cpuinfo").read_text()
    flags = set(text.split("flags", 1)[1].split(":", 1)[1].split("\n", 1)[0].split())
    linux_name = {"avx512bf16": "avx512_bf16"}
    feats = _cpu.cpu_features()
    expect = {k: linux_name.get(k, k) in flags for k in feats}
    # amx_bf16: AMX-BF16 with AMX-TILE (and the tile state granted to this process,
    # which a kernel that lists both flags grants unless a sigaltstack is too small)
    expect["amx_bf16"] = {"amx_bf16", "amx_tile"} <= flags
    wrong = {k: v for k, v in feats.items() if v != expect[k]}
    assert not wrong, f"CPUID/XGETBV and /proc/cpuinfo disagree on {wrong}"
    vendor = text.split("vendor_id", 1)[1].split(":", 1)[1].split("\n", 1)[0].strip()
    assert _cpu.cpu_vendor() == vendor


@pytest.mark.skipif(not (sys.platform.startswith("linux") and _cpu.target_arch() == "aarch64"),
                    reason="compares HWCAP with Linux's /proc/cpuinfo Features (aarch64 Linux)")
def test_arm_features_agree_with_the_kernel():
    if os.environ.get("FASTATTN_EMULATED"):
        pytest.skip("under qemu-user /proc/cpuinfo describes the host, not the emulated CPU")
    text = Path("/proc/cpuinfo").read_text()
    flags = set(text.split("Features", 1)[1].split(":", 1)[1].split("\n", 1)[0].split())
    wrong = {k: v for k, v in _cpu.cpu_features().items() if v != (k in flags)}
    assert not wrong, f"HWCAP and /proc/cpuinfo disagree on {wrong}"


def test_default_choice_is_the_best_automatic_variant():
    can, auto = _variants.supported(None if _dispatch.ARCH == "other" else _dispatch.ARCH,
                                    _cpu.cpu_features(), _cpu.cpu_vendor())
    built_auto = [n for n in auto if n in _dispatch.available_variants()]
    if not os.environ.get("FASTATTN_ISA"):
        assert _dispatch.VARIANT == built_auto[-1]


def _import_with(isa):
    import fastattn

    env = dict(os.environ, FASTATTN_ISA=isa)
    home = Path(fastattn.__file__).resolve().parents[1]     # the fastattn under test, built or installed
    return subprocess.run([sys.executable, "-c", "from fastattn import _dispatch; print(_dispatch.VARIANT)"],
                          capture_output=True, text=True, env=env, cwd=str(home), timeout=120)


@pytest.mark.skipif(bool(os.environ.get("FASTATTN_EMULATED")), reason="spawns Python children (no binfmt under qemu-user)")
def test_forcing_a_variant():
    for name in _dispatch.available_variants():
        r = _import_with(name)
        assert r.returncode == 0 and r.stdout.strip() == name, r.stderr
    r = _import_with("sse9")
    assert r.returncode != 0 and "FASTATTN_ISA='sse9' is not one of" in r.stderr
    other = "neon" if _cpu.target_arch() == "x86_64" else "avx2"
    r = _import_with(other)
    assert r.returncode != 0 and f"FASTATTN_ISA='{other}'" in r.stderr


def test_show_config_names_the_variant(capsys):
    import fastattn

    fastattn.show_config()
    out = capsys.readouterr().out
    assert f"variant in use      : {_dispatch.VARIANT}" in out
    table = {v.name: v for v in _variants.variants_for(None if _dispatch.ARCH == "other" else _dispatch.ARCH)}
    assert table[_dispatch.VARIANT].description in out


# (function of fastattn._memory, its variable, its value on AMD, show_config's words for on / off)
_PREFETCH_SWITCHES = [
    ("prefetch_wide", "FASTATTN_PREFETCH_WIDE", False,
     ("one-row decode units prefetched", "one-row decode units left to the hardware prefetchers")),
    ("prefetch_l2", "FASTATTN_PREFETCH_L2", True,
     ("requested into L2 (prefetcht1)", "requested into L1 (prefetcht0)")),
]


@pytest.mark.parametrize("name, var, amd, words", _PREFETCH_SWITCHES)
def test_prefetch_switches_by_vendor_and_environment(monkeypatch, name, var, amd, words):
    """prefetch_wide: the one-row loops prefetch float32 / float64 rows except on AMD
    CPUs; prefetch_l2: the query-vectorised key hints go into L2 on AMD CPUs, into L1
    elsewhere.  Their variable = 0 / 1 overrides (spaces ignored), anything else
    warns and is ignored; show_config says which, and names the variable when set."""
    import io

    import fastattn
    from fastattn import _memory

    switch = getattr(_memory, name)
    monkeypatch.delenv(var, raising=False)
    assert switch("AuthenticAMD") is amd
    assert switch("GenuineIntel") is (not amd) and switch("") is (not amd)
    monkeypatch.setenv(var, " 1 ")
    assert switch("AuthenticAMD") is True and switch("GenuineIntel") is True
    monkeypatch.setenv(var, "0")
    assert switch("AuthenticAMD") is False and switch("GenuineIntel") is False
    assert f"{words[1]} ({var})" in fastattn.show_config(file=io.StringIO())
    for bad in ("2", "yes", "on", "-1"):
        monkeypatch.setenv(var, bad)
        with pytest.warns(RuntimeWarning, match=var):
            assert switch("AuthenticAMD") is amd
    monkeypatch.delenv(var)
    here = amd if _cpu.cpu_vendor() == "AuthenticAMD" else not amd
    assert f"{words[0] if here else words[1]}\n" in fastattn.show_config(file=io.StringIO())


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8])
def test_prefetch_hints_never_change_a_result(dtype):
    """The same bits with and without the float32 / float64 row prefetch hints, and
    with the hints into L1 or into L2 (all four settings): decode (one row per head,
    D a multiple of the vector and not), grouped-query rows, draft rows, 16 rows
    (query-vectorised, the key panels' hints), a paged decode, one and two threads,
    keys and values of the storage type (float16 / int8: q float32; with int8 also
    QuantizedKV u8 / u4 caches); the settings are restored.  With the wide hints off, the few-rows scores also read a group's
    keys key by key (stored_reads.h): GQA groups of 2, 3, 4 and 8 rows, D a multiple
    of the vector (that order) and not (the group order)."""
    import fastattn

    K = _dispatch.kernels
    rng = np.random.default_rng(20261204)
    qdt = np.float32 if dtype in (np.float16, np.int8) else dtype

    def store(x):
        return np.clip(np.rint(x * 30), -127, 127).astype(np.int8) if dtype == np.int8 else x.astype(dtype)

    cases = []
    for hq, hkv, lq, d in ((4, 4, 1, 128), (4, 4, 1, 40), (8, 2, 1, 64), (4, 2, 3, 64), (4, 2, 1, 128),
                          (6, 2, 1, 96), (16, 2, 1, 128), (8, 2, 1, 40), (2, 2, 16, 64)):
        q = rng.standard_normal((2, hq, lq, d)).astype(qdt)
        k = store(rng.standard_normal((2, hkv, 777, d)))
        v = store(rng.standard_normal((2, hkv, 777, d)))
        cases.append(lambda nt, q=q, k=k, v=v: fastattn.attention(q, k, v, num_threads=nt))
    if dtype == np.int8:    # and QuantizedKV caches (u8 / u4 readers): one row per head, GQA rows
        for hq, hkv, d, bits in ((4, 4, 128, 8), (8, 2, 64, 8), (4, 4, 128, 4), (8, 2, 64, 4)):
            q = rng.standard_normal((2, hq, 1, d)).astype(np.float32)
            k, v = (fastattn.quantize_kv(rng.standard_normal((2, hkv, 777, d)).astype(np.float32), bits=bits)
                    for _ in range(2))
            cases.append(lambda nt, q=q, k=k, v=v: fastattn.attention(q, k, v, num_threads=nt))
    kc = store(rng.standard_normal((40, 2, 16, 64)))
    vc = store(rng.standard_normal((40, 2, 16, 64)))
    table = rng.permutation(40).reshape(2, 20)
    lens = np.array([300, 317])
    qp = rng.standard_normal((2, 8, 1, 64)).astype(qdt)
    cases.append(lambda nt: fastattn.attention_paged(qp, kc, vc, table, lens, num_threads=nt))
    prev_wide, prev_l2 = K.set_prefetch_wide(True), K.set_prefetch_l2(False)
    try:
        for f in cases:
            for nt in (1, 2):
                first = f(nt)
                assert np.isfinite(first).all()
                for wide, l2 in ((False, False), (True, True), (False, True)):
                    K.set_prefetch_wide(wide)
                    K.set_prefetch_l2(l2)
                    np.testing.assert_array_equal(f(nt), first)
                assert K.set_prefetch_wide(True) is False and K.set_prefetch_l2(False) is True
    finally:
        K.set_prefetch_wide(prev_wide)
        K.set_prefetch_l2(prev_l2)
