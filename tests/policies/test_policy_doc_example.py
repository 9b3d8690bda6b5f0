"""docs/policies.md "Writing a policy in 30 lines": the page's code and command, run as shown.

The page is the one place a newcomer learns to write a policy; if the base class moves or
the command's output changes, this fails instead of the page quietly going stale.
"""

from __future__ import annotations

import shlex

from support import ROOT, run_main

from kvsim.cachemode.object_protocol import ObjectCache
from kvsim.policies.registry import eviction_policy_class, make_eviction_policy

PAGE = ROOT / "docs" / "policies.md"
TITLE = "## Writing a policy in 30 lines"
MODULE = "second_chance"


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(TITLE)
    end = text.find("\n## ", start + len(TITLE))
    return text[start : end if end != -1 else len(text)]


def _blocks(lang: str) -> list[str]:
    """The section's fenced code blocks opened with ```LANG (``""``: a bare fence)."""
    blocks, current, opened = [], [], None
    for line in _section().splitlines():
        if line.startswith("```"):
            if opened is None:
                opened, current = line[3:].strip(), []
            else:
                if opened == lang:
                    blocks.append("\n".join(current) + "\n")
                opened = None
        elif opened is not None:
            current.append(line)
    return blocks


def _install_example(tmp_path, monkeypatch) -> None:
    """The page's one Python block, saved under the module name the page gives it."""
    (code,) = _blocks("python")
    assert f"Save it as `{MODULE}.py`" in _section()
    assert len(code.strip().splitlines()) <= 40  # the page promises about 30 lines
    (tmp_path / f"{MODULE}.py").write_text(code, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_the_example_is_a_policy_the_registry_accepts(tmp_path, monkeypatch):
    _install_example(tmp_path, monkeypatch)
    cls = eviction_policy_class(f"{MODULE}:SecondChancePolicy")
    assert cls.__module__ == MODULE and cls.name == "second-chance"


def test_the_example_gives_a_reused_chunk_its_second_chance(tmp_path, monkeypatch):
    """Capacity 3, stream 1 2 3 1 4 1: FIFO evicts 1 for 4 and misses 1 again; second
    chance spares the reused 1, evicts 2, and hits 1 (one miss fewer)."""
    _install_example(tmp_path, monkeypatch)
    stream = [1, 2, 3, 1, 4, 1]

    def misses(spec: str) -> int:
        return ObjectCache(make_eviction_policy(spec, 3), 3).run(stream).misses

    assert misses("fifo") == 5
    assert misses(f"{MODULE}:SecondChancePolicy") == 4


def test_the_shown_command_prints_the_shown_lines(tmp_path, monkeypatch, capsys):
    """The page's `$ PYTHONPATH=. kvsim replay ...` run as shown: every output line the page
    pastes (the rest is `...`) is a line of the real output."""
    _install_example(tmp_path, monkeypatch)
    (block,) = [b for b in _blocks("") if "--policy second_chance:" in b]
    prompt, *shown = block.strip().splitlines()
    words = shlex.split(prompt.removeprefix("$ "))
    assert words[:2] == ["PYTHONPATH=.", "kvsim"]
    args = [str(ROOT / w) if w.startswith("traces/") else w for w in words[2:]]
    code, out, err = run_main(args, capsys)
    assert code == 0, err
    real = {" ".join(line.split()) for line in out.splitlines()}
    expected = [" ".join(line.split()) for line in shown if line.strip() != "..."]
    assert len(expected) >= 4
    assert [line for line in expected if line not in real] == []
