"""docs/models.md and the fidelity suite say the same: every layout the suite holds has its row, every row
names a layout the suite holds (or a test that exists), and every refusal's documented sentence is the one
`launch` prints."""

from __future__ import annotations

import re

from tests.fidelity.layouts import REFUSED, SERVED
from tests.fidelity.models_doc import ROOT, documented_rows

TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def test_every_layout_of_the_suite_has_its_row_and_every_refusal_its_sentence() -> None:
    rows = documented_rows()
    missing = [case.id for case in [*SERVED, *REFUSED] if case.id not in rows]
    assert not missing, f"docs/models.md has no row for {missing}"
    for case in REFUSED:
        assert case.message in rows[case.id], f"{case.id}: the documented sentence is not {case.message!r}"


def test_every_row_names_a_layout_of_the_suite_or_a_test_that_exists() -> None:
    suite = {case.id for case in [*SERVED, *REFUSED]}
    for layout_id, rest in documented_rows().items():
        if layout_id in suite:
            continue
        references = TEST_REFERENCE.findall(rest)
        assert references, f"the row {layout_id} names neither a layout of tests/fidelity/layouts.py nor a test"
        for path, function in references:
            source = (ROOT / path).read_text()
            assert not function or f"def {function}(" in source, f"{layout_id}: {path}::{function} does not exist"
