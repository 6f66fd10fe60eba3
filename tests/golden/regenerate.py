"""Write the frozen outputs of ``tests/golden/configs`` (issue 24's behaviour lock).

Run only when a change of behaviour is intended, and say why in the commit:
    OMP_NUM_THREADS=1 python tests/golden/regenerate.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from tests.golden.frozen import CONFIGS, run_config  # noqa: E402


def main() -> None:
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    (HERE / "expected" / "CPU_CAPABILITY").write_text(capability + "\n")
    for name in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            outputs = run_config(name, Path(tmp))
            target = HERE / "expected" / name
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            for filename, path in outputs.items():
                shutil.copyfile(path, target / filename)
                print(f"{name}/{filename}")


if __name__ == "__main__":
    main()
