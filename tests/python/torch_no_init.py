"""A DDP script that forgot keel.torch.init(): under `python3 -m keel.torch` it is told so."""
import torch

print("training without keel: %s" % torch.ones(1).tolist(), flush=True)
