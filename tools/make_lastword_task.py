"""Write the last-word task's data (zoo/interop/lm_eval_tasks/lastword.jsonl) from the embedded corpus.

The sentences come from the docstrings of a few standard-library modules (text_lm's default corpus):
each sentence of 8 to 30 words whose last word is alphabetic, the first 48 in module order.

    python tools/make_lastword_task.py
"""

import ast
import inspect
import json
import re
from pathlib import Path

MODULES = ("textwrap", "argparse", "json", "csv", "logging", "pathlib", "collections", "heapq", "bisect", "shutil")
OUT = Path(__file__).resolve().parents[1] / "zoo" / "interop" / "lm_eval_tasks" / "lastword.jsonl"


def sentences(module_name: str):
    tree = ast.parse(inspect.getsource(__import__(module_name)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node):
            text = " ".join(ast.get_docstring(node).split())
            for sentence in re.split(r"(?<=[.!?])\s+", text):
                words = sentence.rstrip(".!?").split(" ")
                if 8 <= len(words) <= 30 and words[-1].isalpha():
                    yield " ".join(words)


def main() -> None:
    rows = [s for m in MODULES for s in sentences(m)][:48]
    OUT.write_text("".join(json.dumps({"text": s}) + "\n" for s in rows))
    print(f"{len(rows)} sentences -> {OUT}")


if __name__ == "__main__":
    main()
