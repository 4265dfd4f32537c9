"""torch.nn.parallel.DistributedDataParallel around a remat.Checkpointable: 2 processes on Gloo
over loopback train exactly as plain DDP does (gradients, parameters, BatchNorm buffers)."""

import copy
import datetime
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import remat

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this torch has no Gloo backend")


def network() -> nn.Sequential:
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.BatchNorm1d(128), nn.Linear(128, 128), nn.GELU(),
                         nn.Dropout(0.2), nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 8))


def _worker(rank: int, world: int, directory: str, budget: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        # The ranks start from different weights: DDP broadcasts rank 0's.
        torch.manual_seed(rank)
        plain_model = network()
        ours_model = copy.deepcopy(plain_model)
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(100 + rank))
        chk = remat.Checkpointable(ours_model, x, progress=False)
        solution = chk.compute_sequence(chk.min_budget() if budget == "least" else budget)
        assert solution.ok
        if budget == "least":
            assert "Fn" in solution.sequence or "CF" in solution.sequence
        plain, ours = DDP(plain_model), DDP(chk)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, ours)]
        for step in range(3):
            for model, optimizer in zip((plain, ours), optimizers):
                optimizer.zero_grad()
                torch.manual_seed(1000 * step + rank)  # each rank's own dropout masks
                model(x).square().mean().backward()
            # DDP averaged the gradients over the ranks: equal, bit for bit, to plain DDP's.
            for (name, p), q in zip(plain_model.named_parameters(), ours_model.parameters()):
                assert torch.equal(p.grad, q.grad), f"rank {rank}, step {step}: gradient of {name}"
            for optimizer in optimizers:
                optimizer.step()
        for (name, p), q in zip(plain_model.state_dict().items(), ours_model.state_dict().values()):
            assert torch.equal(p, q), f"rank {rank}: {name} after 3 steps"
        # For the parent to check that every rank holds the same parameters (not buffers: each
        # rank's BatchNorm statistics saw its own batch last, as in plain DDP). (Through files: with
        # a Gloo all_gather just before destroy_process_group, torch 2.11's workers sometimes
        # abort at exit, "terminate called without an active exception", remat or not.)
        torch.save({n: p.detach() for n, p in ours_model.named_parameters()}, f"{directory}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("budget", ["least", "70%"])
def test_ddp_around_a_checkpointable_equals_plain_ddp(tmp_path, budget):
    world = 2
    context = mp.start_processes(_worker, args=(world, str(tmp_path), budget),
                                 nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + 240
    # join() raises, with the worker's traceback, as soon as a worker fails.
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the DDP workers did not finish within 240 s")
    states = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]
    for name, value in states[0].items():
        assert all(torch.equal(value, state[name]) for state in states[1:]), name
