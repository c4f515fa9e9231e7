"""The grader: proves a submission correct against an fp64 oracle, then times it honestly.

Trust boundary (SPEC §6): the process that holds the secret seed, the ground truth, the budgets and
the verdict never imports submission code. Submission code runs only in child processes, and what
they report is re-checked here.
"""
