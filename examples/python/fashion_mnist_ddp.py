"""A small CNN trained on Fashion-MNIST with PyTorch's stock DistributedDataParallel.

  python3 -m keel.torch --nproc-per-node 2 -- fashion_mnist_ddp.py            # keel
  torchrun --nproc_per_node 2 fashion_mnist_ddp.py --backend gloo             # gloo

With --backend keel the script differs from a plain DDP script by the three keel.torch
lines below. Rank 0 prints the test accuracy; every rank prints the crc32 of its parameters,
so that runs can be compared bit for bit.
"""
import argparse
import gzip
import os
import sys
import time
import zlib

import numpy
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path, offset):
    with gzip.open(path, "rb") as stream:
        return numpy.frombuffer(stream.read(), dtype=numpy.uint8, offset=offset)


def fashion_mnist(directory, split, limit):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(directory, prefix + "-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(directory, prefix + "-labels-idx1-ubyte.gz"), 8)
    images = torch.from_numpy(images.reshape(-1, 1, 28, 28).astype(numpy.float32) / 255.0)
    labels = torch.from_numpy(labels.astype(numpy.int64))
    if limit:
        images, labels = images[:limit], labels[:limit]
    return TensorDataset(images, labels)


class Net(torch.nn.Module):
    def __init__(self, width, hidden, dropout):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, width, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(width, 2 * width, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(2 * width * 5 * 5, hidden), torch.nn.ReLU(),
            torch.nn.Dropout(dropout), torch.nn.Linear(hidden, 10))

    def forward(self, images):
        return self.classifier(self.features(images))


def options():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("keel", "gloo"), default="keel")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--train-samples", type=int, default=0, help="0: all 60000")
    parser.add_argument("--test-samples", type=int, default=0, help="0: all 10000")
    parser.add_argument("--width", type=int, default=8, help="channels of the first layer")
    parser.add_argument("--hidden", type=int, default=64, help="units of the hidden layer")
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="dropout before the last layer (draws from torch's RNG each step)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DDP's bucket size (small: several buckets, rebuilt after step 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=DATA)
    parser.add_argument("--checkpoint",
                        help="gloo: rank 0 saves here (torch.save), and a restart resumes from it")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="gloo: steps between checkpoints (0: at each epoch's end)")
    parser.add_argument("--step-log", help="append 'rank pid step monotonic_ns' after each step")
    return parser.parse_args()


def save(path, model, optimizer, epoch, step_in_epoch, steps):
    """Rank 0's checkpoint for a torchrun restart: written aside, then renamed over."""
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch, "step_in_epoch": step_in_epoch, "steps": steps}, path + ".new")
    os.replace(path + ".new", path)


def evaluate(model, dataset):
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in DataLoader(dataset, batch_size=1000):
            correct += int((model(images).argmax(1) == labels).sum())
    return correct / len(dataset)


def checksum(model):
    crc = 0
    for parameter in model.parameters():
        crc = zlib.crc32(parameter.detach().numpy().tobytes(), crc)
    return crc


def main():
    args = options()
    torch.manual_seed(args.seed)
    if args.backend == "keel":
        import keel.torch
        keel.torch.init()
    else:
        dist.init_process_group("gloo")
    train = fashion_mnist(args.data_dir, "train", args.train_samples)
    model = DistributedDataParallel(Net(args.width, args.hidden, args.dropout), bucket_cap_mb=args.bucket_cap_mb)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = DistributedSampler(train, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch, sampler=sampler)
    first_epoch, first_step, total_steps = 0, 0, 0
    if args.backend == "keel":
        keel.torch.register(model, optimizer, sampler)
    elif args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first_epoch, first_step, total_steps = (saved["epoch"], saved["step_in_epoch"],
                                                saved["steps"])
    log = open(args.step_log, "a", buffering=1) if args.step_log else None

    steps, started = 0, time.perf_counter()
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for index, (images, labels) in enumerate(loader):
            if epoch == first_epoch and index < first_step:
                continue  # a gloo restart skips what its checkpoint already holds
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            steps += 1
            total_steps += 1
            if log is not None:
                log.write("%d %d %d %d\n" % (dist.get_rank(), os.getpid(), total_steps,
                                             time.monotonic_ns()))
            if (args.backend == "gloo" and args.checkpoint and args.checkpoint_every
                    and total_steps % args.checkpoint_every == 0 and dist.get_rank() == 0):
                save(args.checkpoint, model, optimizer, epoch, index + 1, total_steps)
        if args.backend == "gloo" and args.checkpoint and dist.get_rank() == 0:
            save(args.checkpoint, model, optimizer, epoch + 1, 0, total_steps)
    elapsed = time.perf_counter() - started
    rank, world = dist.get_rank(), dist.get_world_size()
    print("rank %d world %d steps %d step_ms %.3f checksum %08x"
          % (rank, world, steps, 1000.0 * elapsed / max(steps, 1), checksum(model)), flush=True)
    if rank == 0:
        test = fashion_mnist(args.data_dir, "test", args.test_samples)
        print("test accuracy %.4f" % evaluate(model.module, test), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
