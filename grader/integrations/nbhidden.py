"""nbgrader's autograde without its false tampering alarm on hidden tests (nbgrader 0.9.6; upstream
issue jupyter/nbgrader#1961). nbgrader_config.py puts RestoreHiddenTests in OverwriteCells' place.

Why the alarm: `generate_assignment` stores each grade cell in the gradebook (SaveCells) *before*
ClearHiddenTests removes its `### BEGIN HIDDEN TESTS` region, then recomputes the checksum of the
released cell. A released hidden-test cell therefore never has the checksum the gradebook holds, and
OverwriteCells, at autograde, says "Attribute 'checksum' for cell test_hidden_all_reduce_1 has changed!" for
every hidden cell of every untouched notebook, then restores the stored source (which is how the hidden
tests come back). RestoreHiddenTests restores such a cell silently when it is exactly the released one
(the stored source with its hidden region cleared); any other change is reported as before.

FeedbackHiddenTests is ClearHiddenTests for generate_feedback's list (nbgrader_config.py), accepting the
`display_data_priority` that nbconvert's HTML exporter sets for every NbConvertBase: nbgrader declares that
trait on its preprocessors without `config=True` (only GetGrades redeclares it), so ClearHiddenTests said
"Config option `display_data_priority` not recognized" on every generate_feedback. Removing hidden tests
reads no output, so the value changes nothing there.

A grade cell the student deleted is put back (`add_missing_cells`) as nbgrader builds it, without a cell id,
which nbformat 4.5 requires: nbformat then warned "Cell is missing an id field" under nbgrader's own
"Missing grade cell" line. RestoreHiddenTests gives the cell an id of its own.
"""
from __future__ import annotations

import uuid

import nbformat
from nbgrader.api import MissingEntry
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, OverwriteCells
from traitlets import List


class RestoreHiddenTests(OverwriteCells):

    def preprocess_cell(self, cell, resources, cell_index):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id is not None and cell.cell_type == "code":
            try:
                stored = self.gradebook.find_source_cell(grade_id, self.notebook_id, self.assignment_id)
            except MissingEntry:
                stored = None   # OverwriteCells says so
            if stored is not None and stored.locked and cell.source != stored.source \
                    and cell.source == released(stored.source, self):
                cell.source = stored.source   # the untouched release: its hidden tests, back without a warning
        return super().preprocess_cell(cell, resources, cell_index)

    def missing_cell_transform(self, source_cell, max_score, is_solution=False, is_task=False):
        cell = super().missing_cell_transform(source_cell, max_score, is_solution=is_solution, is_task=is_task)
        cell.setdefault("id", f"restored-{uuid.uuid4().hex[:12]}")
        return cell


class FeedbackHiddenTests(ClearHiddenTests):
    display_data_priority = List(GetGrades.display_data_priority.default_value, config=True)


def released(source: str, parent=None) -> str:
    """What generate_assignment releases of a test cell's source: its hidden region removed."""
    cell = nbformat.v4.new_code_cell(source)
    ClearHiddenTests(parent=parent)._remove_hidden_test_region(cell)
    return cell.source
