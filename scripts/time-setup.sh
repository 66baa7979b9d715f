#!/usr/bin/env bash
# Times the README's two set-up commands as a new user runs them: a fresh clone of this
# repository's HEAD, an empty target/, no KVLAB_MODELS (crates already in cargo's registry cache
# are not downloaded again). Writes benches/setup.json, which `cargo xtask readme` renders into
# the README's set-up section:
#
#   scripts/time-setup.sh && cargo xtask readme
#
# Takes about 13 minutes on a 2-core machine; run it on an otherwise idle one.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/kvlab-setup-XXXXXX)"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/kvlab"
cd "$work/kvlab"
unset KVLAB_MODELS CARGO_TARGET_DIR
export CARGO_INCREMENTAL=0
now() { date +%s.%N; }
bytes() { du -sb target | cut -f1; }

t0=$(now)
cargo run --release -p kvlab-cli -- generate --temperature 0 --prompt "Once upon a time" >/dev/null 2>"$work/cmd1.err" \
    || { cat "$work/cmd1.err" >&2; exit 1; }
t1=$(now)
after1=$(bytes)
cargo test --workspace --no-run >/dev/null 2>"$work/build2.err" || { tail -30 "$work/build2.err" >&2; exit 1; }
t2=$(now)
cargo test --workspace >"$work/tests.out" 2>&1 || { tail -30 "$work/tests.out" >&2; exit 1; }
t3=$(now)
after2=$(bytes)

python3 - "$repo/benches/setup.json" <<PY
import json, platform, subprocess, sys, datetime
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
record = {
    "what": "wall seconds of the README's set-up commands in a fresh clone (empty target/, registry cache warm), and the size of target/ after each",
    "command": "scripts/time-setup.sh",
    "machine": {
        "cpu_model": cpu,
        "logical_cpus": int(subprocess.check_output(["nproc"]).strip()),
        "rustc": subprocess.check_output(["rustc", "--version"], text=True).strip(),
        "git_commit": subprocess.check_output(["git", "-C", "$work/kvlab", "rev-parse", "HEAD"], text=True).strip(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    },
    "command1_s": round($t1 - $t0, 1),
    "command2_build_s": round($t2 - $t1, 1),
    "command2_tests_s": round($t3 - $t2, 1),
    "target_bytes_after_command1": $after1,
    "target_bytes_after_command2": $after2,
}
with open(sys.argv[1], "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
print(json.dumps(record, indent=1))
PY
