"""Code that runs inside a sandboxed child process, next to the submission.

Imports nothing else from ``grader/`` (only the standard library, torch, triton, numpy, the frozen
block in ``task/`` and the reference). The trusted parent may import it for shared formats.
"""
