"""Everything that runs inside a sandboxed child process, next to untrusted code: the gate's
harness (`gate`), the two timing processes (`baselines`, trusted; `submission`, the submission's),
their shared step code (`steps`), the channel (`channel`), the census (`census`) and the rule
guard (`rules`, `state`, `imports`).

The trust boundary is this folder's: it imports nothing else of ``grader/`` (only the standard
library, torch, triton, numpy, the frozen block in ``task/`` and the reference), and the parent
passes it everything else (`tests/test_layout.py` holds that). The trusted parent may import it
for shared formats (frames, census messages, op lists).
"""
