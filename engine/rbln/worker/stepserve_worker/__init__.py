"""stepserve's device worker: runs each bucket's compiled step graph on one
logical RBLN device (or torch's CPU where torch_rbln is absent), inside
torch.rbln.explain(), for the Go supervisor in engine/rbln.

Dependencies: torch and the standard library only.
"""

PROTOCOL_VERSION = 3
