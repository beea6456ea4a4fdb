# Sourced by scripts/*: create .venv with the given extras if absent, then use it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extras="${1:-}"
stamp=".venv/.installed${extras:+-$extras}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
  touch "$stamp"
  just_installed=1  # (scripts/_workers.sh: the load average now counts this install)
fi
export PATH="$root/.venv/bin:$PATH"
