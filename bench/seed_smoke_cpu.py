"""The seed's smoke test as a bare script, on CPU with gloo: the baseline of bench/overhead.py."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(7)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        sampler = DistributedSampler(data, shuffle=True)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
        model = DDP(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
        print("rank", dist.get_rank(), "device", local_rank, "completed", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
