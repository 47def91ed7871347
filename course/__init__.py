"""The course kit: handouts, a grader, a Gradescope bundle (python -m course --help)."""
