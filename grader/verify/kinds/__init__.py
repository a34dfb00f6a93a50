"""The kinds of checks the engine decides, one module each (the table of them: exercise/kinds.py); each
exposes evaluate(judge, check, runs) -> CheckResult."""
