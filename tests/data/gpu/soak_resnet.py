"""The soak test's program (issue #18): ResNet-18 training steps, random weights and data.

pyrun -e gpu=nvidia -t -o OUT python3 tests/data/gpu/soak_resnet.py [STEPS]
"""

import sys

import torch
import torchvision

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
model = torchvision.models.resnet18(weights=None).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = torch.randn(64, 3, 224, 224, device="cuda")
target = torch.randint(0, 1000, (64,), device="cuda")
for _ in range(steps):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
torch.cuda.synchronize()
print("steps", steps, "loss", float(loss))
