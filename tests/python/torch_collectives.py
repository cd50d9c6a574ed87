"""Every collective of the "keel" backend through torch.distributed's public API, checked
against values each rank can compute alone: allreduce (SUM, AVG, MAX) over each supported
dtype, broadcast from the last rank, all_gather, all_gather_into_tensor, reduce_scatter,
barrier, async_op handles; then a step's collectives inside a training step."""
import sys

import torch
import torch.distributed as dist

import keel.torch


def expect(what, got, wanted):
    if not torch.equal(got, wanted):
        print("FAIL %s: got %s, wanted %s" % (what, got.tolist(), wanted.tolist()), flush=True)
        sys.exit(1)


def main():
    keel.torch.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "keel", dist.get_backend()
    ranks = torch.arange(world)
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16):
        tensor = torch.full((5,), rank + 1, dtype=dtype)
        dist.all_reduce(tensor)
        expect("sum %s" % dtype, tensor, torch.full((5,), int((ranks + 1).sum()), dtype=dtype))
        tensor = torch.full((3,), rank * 2, dtype=dtype)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        expect("max %s" % dtype, tensor, torch.full((3,), (world - 1) * 2, dtype=dtype))
    tensor = torch.full((4,), float(rank), dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.AVG)
    expect("avg", tensor, torch.full((4,), float(ranks.sum()) / world, dtype=torch.float64))

    tensor = torch.arange(6, dtype=torch.int16) * (rank + 1)  # any dtype moves as bytes
    dist.broadcast(tensor, src=world - 1)
    expect("broadcast", tensor, torch.arange(6, dtype=torch.int16) * world)

    outputs = [torch.empty(2, dtype=torch.float32) for _ in range(world)]
    dist.all_gather(outputs, torch.tensor([rank, -rank], dtype=torch.float32))
    expect("all_gather", torch.stack(outputs),
           torch.stack([torch.tensor([r, -r], dtype=torch.float32) for r in range(world)]))
    output = torch.empty(world * 2, dtype=torch.int64)
    dist.all_gather_into_tensor(output, torch.tensor([rank, rank * 10]))
    expect("all_gather_into_tensor", output,
           torch.tensor([v for r in range(world) for v in (r, r * 10)]))

    inputs = [torch.full((3,), float(rank * 100 + block)) for block in range(world)]
    output = torch.empty(3)
    dist.reduce_scatter(output, inputs)
    expect("reduce_scatter", output, torch.full((3,), float(ranks.sum() * 100 + world * rank)))

    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    dist.barrier()

    # Inside a training step the same calls are step collectives (recoverable).
    torch.manual_seed(1)
    model = keel.torch.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.Adam(model.parameters())
    keel.torch.register(model, optimizer)
    loss = model(torch.ones(2, 4)).sum()
    statistic = torch.tensor([float(rank)])
    dist.all_reduce(statistic)
    expect("in-step sum", statistic, torch.tensor([float(ranks.sum())]))
    loss.backward()
    optimizer.step()
    print("collectives ok rank %d of %d" % (rank, world), flush=True)


if __name__ == "__main__":
    main()
