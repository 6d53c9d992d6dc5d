"""Where the tests find the project and their data."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = ROOT / "tests" / "data"  # recorded GPU data, models built from configs, kernel files, problems
KERNELBENCH = DATA / "kernelbench"  # KernelBench problems and solutions, honest and cheating
GOOD_KERNELS = DATA / "kernels" / "good"  # correct kernels written unlike the starters
