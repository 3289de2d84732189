"""The MNIST MLP tutorial's training, as written, timed: the baseline this project is measured
against.

    python benchmarks/tutorials/mnist_mlp.py DATA_DIR [MNIST|FashionMNIST] [EPOCHS] [--seed N]

DATA_DIR is a `--data.data_dir` of train.py: it holds torchvision's `MNIST/raw/` or
`FashionMNIST/raw/` (downloaded there if missing). MLP 784-128-10, Adam lr 0.001, batch 64,
10 epochs, the GPU if there is one. Prints the tutorial's loss lines, then
`RESULT ... train_s=... test_acc=...`.
"""

import sys
import time

import torch
import torch.nn as nn
from torchvision import datasets, transforms


class MLP(nn.Module):
    def __init__(self, input_size, hidden_size, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(input_size, hidden_size)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden_size, num_classes)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


if __name__ == "__main__":
    # the benchmark's repeats
    seed = int(sys.argv.pop(sys.argv.index("--seed") + 1)) if "--seed" in sys.argv else 0
    sys.argv = [a for a in sys.argv if a != "--seed"]
    root = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 else "MNIST"
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    torch.manual_seed(seed)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
    dataset = getattr(datasets, name)
    train_loader = torch.utils.data.DataLoader(
        dataset(root, train=True, download=True, transform=transform), batch_size=64, shuffle=True)
    test_loader = torch.utils.data.DataLoader(
        dataset(root, train=False, download=True, transform=transform), batch_size=1000)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = MLP(784, 128, 10).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in range(epochs):
        for data, target in train_loader:
            # the tutorial omits the flatten that nn.Linear(784) needs
            data, target = data.view(data.size(0), -1).to(device), target.to(device)
            optimizer.zero_grad()
            loss = criterion(model(data), target)
            loss.backward()
            optimizer.step()
        print(f"Epoch {epoch + 1}, Loss: {loss.item()}", flush=True)
    train_s = time.perf_counter() - start
    correct = total = 0
    with torch.no_grad():
        for x, y in test_loader:
            correct += (model(x.view(x.size(0), -1).to(device)).argmax(1).cpu() == y).sum().item()
            total += len(y)
    print(f"RESULT tutorial_mlp data={name} epochs={epochs} train_s={train_s:.1f} "
          f"test_acc={correct / total:.4f}")
