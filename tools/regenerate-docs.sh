#!/usr/bin/env bash
# Regenerate the generated parts of docs/ and README.md: the scenario key reference, the
# published-measurements note, the reproduction note and the demo's note and quote. The
# generators live in the package (ddlsim.scenarios.docgen, .published, .reproduce, .demodoc)
# and write only where they are told; this script, outside the package, tells them this
# repository. Run from anywhere, with this checkout installed editable (pip install -e .);
# arguments go to the reproduction (e.g. --quick, --jobs N). Takes several minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
"$python" - <<'PY' || exit 2
import pathlib, sys
import ddlsim
here, got = pathlib.Path.cwd().resolve(), pathlib.Path(ddlsim.__file__).resolve().parent
if got != here:
    sys.exit(f"regenerate-docs: error: ddlsim is imported from {got}, not from this checkout {here} "
             "(pip install -e . here first)")
PY
"$python" -m ddlsim.scenarios.docgen --write docs/scenarios.md
"$python" -m ddlsim.scenarios.published --out docs/published-validation.md
"$python" -m ddlsim.scenarios.reproduce --out docs --quiet "$@"
"$python" -m ddlsim.scenarios.demodoc --docs docs --readme README.md
