"""Each call the "keel" backend does not serve raises keel.torch.UnsupportedError naming it,
at once, in every rank (never a hang, never wrong data). Prints one line per call."""
import torch
import torch.distributed as dist

import keel.torch


def attempt(name, call):
    try:
        call()
    except keel.torch.UnsupportedError as error:
        print("unsupported %s: %s" % (name, error), flush=True)
        return
    print("NOT REFUSED %s" % name, flush=True)


def main():
    keel.torch.init()
    rank = dist.get_rank()
    tensor = torch.ones(4)
    attempt("new_group", lambda: dist.new_group([0]))
    attempt("meta tensor", lambda: dist.all_reduce(torch.ones(2, device="meta")))
    attempt("float16", lambda: dist.all_reduce(torch.ones(2, dtype=torch.float16)))
    attempt("uint8", lambda: dist.all_reduce(torch.ones(2, dtype=torch.uint8)))
    attempt("product", lambda: dist.all_reduce(tensor, op=dist.ReduceOp.PRODUCT))
    attempt("min", lambda: dist.all_reduce(tensor, op=dist.ReduceOp.MIN))
    attempt("reduce", lambda: dist.reduce(tensor, dst=0))
    attempt("gather", lambda: dist.gather(tensor, [torch.ones(4) for _ in range(2)] if rank == 0
                                          else None, dst=0))
    attempt("scatter", lambda: dist.scatter(tensor, [torch.ones(4) for _ in range(2)] if rank == 0
                                            else None, src=0))
    attempt("all_to_all", lambda: dist.all_to_all([torch.ones(1)] * 2, [torch.ones(1)] * 2))
    attempt("send", lambda: dist.send(tensor, dst=1 - rank))
    attempt("recv", lambda: dist.recv(tensor, src=1 - rank))
    attempt("sparse", lambda: dist.all_reduce(torch.ones(2).to_sparse()))
    model = keel.torch.DistributedDataParallel(torch.nn.Linear(2, 2))
    attempt("optimizer", lambda: keel.torch.register(
        model, torch.optim.RMSprop(model.parameters())))
    attempt("sampler", lambda: keel.torch.register(
        model, torch.optim.SGD(model.parameters(), lr=0.1),
        torch.utils.data.RandomSampler(range(10))))
    # After all that the group still works.
    dist.all_reduce(tensor)
    print("still working: %s" % tensor.tolist(), flush=True)


if __name__ == "__main__":
    main()
