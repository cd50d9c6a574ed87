"""With keel.torch.init(recovery=False) a rank's death reaches the script as an exception
it can catch, keel.torch.CollectiveError, out of optimizer.step() (backward ends with the
gradients unreduced and step() refuses to apply them); the test kills rank 1."""
import sys

import torch

import keel.torch

keel.torch.init(recovery=False)
torch.manual_seed(1)
model = keel.torch.DistributedDataParallel(torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
keel.torch.register(model, optimizer)
before = [p.detach().clone() for p in model.parameters()]
for step in range(20):
    optimizer.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    try:
        optimizer.step()
    except keel.torch.CollectiveError as error:
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        print("caught CollectiveError at step %d, parameters unchanged: %s: %s"
              % (step, unchanged, error), flush=True)
        sys.exit(0)
    before = [p.detach().clone() for p in model.parameters()]
print("no failure seen", flush=True)
