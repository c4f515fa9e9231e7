"""The grader: proves a submission correct against an fp64 oracle, then times it honestly.

Trust boundary (SPEC §6): the modules at this level (gate, timing, score, report, sandbox, ...)
hold the secret seed, the ground truth, the budgets and the verdict, and never import submission
code. Submission code runs only in child processes (`grader.child`, the only code that runs beside
it), and what they report is re-checked here. The agent's tools are `grader.agent`.
"""
