#!/usr/bin/env bash
# Build the one abi3 wheel, install it into a fresh virtual environment whose PATH has no
# Rust toolchain, and run the README's examples and the `tiermem` command from it.
# Usage: scripts/check_wheel.sh [BUILD_VENV] (default .venv, which has maturin).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
out=target/wheel-check
rm -rf "$out"
mkdir -p "$out"
"$venv/bin/maturin" build --release -q -o "$out/wheels"
wheels=("$out"/wheels/tiermem-*.whl)
[ "${#wheels[@]}" -eq 1 ] || { echo "expected one wheel, got: ${wheels[*]}"; exit 1; }
case "${wheels[0]}" in
  *-abi3-*) ;;
  *) echo "not an abi3 wheel: ${wheels[0]}"; exit 1 ;;
esac
python3 -m venv "$out/venv"
# tiermem from the wheel alone, its dependencies (numpy, rich) from the registry. PyTorch,
# which the README's torch example needs, is 5 GB: it is borrowed from the build
# environment through a path entry appended after the new environment's own packages (that
# environment's .pth files, among them an editable tiermem, are not read from there).
"$out/venv/bin/pip" install -q "${wheels[0]}" pytest
torch_site=$("$venv/bin/python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
site=$("$out/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$torch_site" > "$site/zz-borrowed-torch.pth"
clean_path="$PWD/$out/venv/bin:/usr/bin:/bin"
if env -i PATH="$clean_path" HOME="$HOME" sh -c 'command -v cargo || command -v rustc' >/dev/null; then
  echo "a Rust toolchain is on the clean PATH; the check would prove nothing"; exit 1
fi
# From a directory without the sources, so `import tiermem` can only find the wheel.
cp tests/cli/test_readme.py "$out/"
sed -i "s|parents\[2\] / \"README.md\"|parents[0] / \"README.md\"|" "$out/test_readme.py"
cp README.md "$out/"
printf "[pytest]\n" > "$out/pytest.ini"  # not the repository's configuration
cd "$out"
env -i PATH="$clean_path" HOME="$HOME" python - <<'PY'
import os, sys, tiermem
assert tiermem.__file__.startswith(os.path.join(sys.prefix, "lib")), f"tiermem from {tiermem.__file__}, not the wheel"
print(f"tiermem {tiermem.__version__} from {tiermem.__file__}")
PY
env -i PATH="$clean_path" HOME="$HOME" python -m pytest -q -p no:cacheprovider test_readme.py
env -i PATH="$clean_path" HOME="$HOME" tiermem info >/dev/null
echo "wheel ok: ${wheels[0]##*/} installs and runs the README examples without Rust"
