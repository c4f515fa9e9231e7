"""Known bad: does part of its forward in a thread that starts and ends inside the call.

Thread counts taken between phases never see it (it has ended by then); only counting thread
starts does. A helper thread like this could, for instance, overlap host work with the timed
window of another block. Expected: rule_broken, new-thread.
"""

import threading

from naive_triton import DilatedResidualBlock as _Naive

EXPECTED = "fail:rule_broken:new-thread"


class DilatedResidualBlock(_Naive):
    def forward(self, x):
        box = []
        worker = threading.Thread(target=lambda: box.append(super(DilatedResidualBlock, self)
                                                            .forward(x)))
        worker.start()
        worker.join()
        return box[0]
