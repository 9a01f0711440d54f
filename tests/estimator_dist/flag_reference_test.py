"""docs/flags.md is exactly what the flag definitions generate.

Each program's flags are read by importing its module in a process of its own
(nothing is trained); two of those processes import TensorFlow.
"""

import difflib
import pathlib

import pytest
from absl import flags

from estimator_dist import flag_reference, train

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / flag_reference.DOC_PATH


@pytest.mark.multiprocess
def test_docs_flags_md_is_the_generated_reference():
    expected = flag_reference.render()
    actual = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                actual.splitlines(keepends=True),
                expected.splitlines(keepends=True),
                "docs/flags.md",
                "render()",
            )
        )
        raise AssertionError(
            "docs/flags.md is out of date with the flag definitions; regenerate it with "
            f"{flag_reference.REGENERATE} and commit it.\n{diff[:6000]}"
        )


def test_every_training_flag_has_a_row_in_its_section():
    flag_values = flags.FlagValues()
    train.define_flags(flag_values)
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## estimator_dist.train\n", 1)[1].split("\n## ", 1)[0]
    missing = [
        name
        for name in flag_values
        if f"| `--{'[no]' if flag_values[name].boolean else ''}{name}` |" not in section
    ]
    assert not missing, (
        f"flags {missing} of estimator_dist.train are not in docs/flags.md; regenerate it with "
        f"{flag_reference.REGENERATE}."
    )


def test_a_new_flag_changes_the_section():
    program = flag_reference.PROGRAMS[0]
    described = {"summary": "Train.", "flags": {program.module: []}}
    before = flag_reference.render_program(program, described)
    new = flags.FlagValues()
    flags.DEFINE_integer("new_flag", 3, "A | new <flag>.", lower_bound=1, flag_values=new)
    described["flags"][program.module].append(flag_reference.describe_flag(new["new_flag"]))
    after = flag_reference.render_program(program, described)
    assert after[: len(before)] == before
    assert after[len(before) :] == ["| `--new_flag` | int, >= 1 | 3 | A \\| new &lt;flag>. |"]
