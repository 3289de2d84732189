"""The PyTorch CIFAR-10 tutorial's training, as written, timed: the baseline this project is
measured against.

    python benchmarks/tutorials/cifar10_cnn.py DATA_DIR [EPOCHS] [--seed N]

DATA_DIR is a `--data.data_dir` of train.py: it holds torchvision's `cifar-10-batches-py/`
(downloaded there if missing). Batch 4, SGD lr 0.001 momentum 0.9, 2 epochs, PIL transforms in a
2-worker DataLoader, the GPU if there is one. Prints the tutorial's loss lines, then
`RESULT ... train_s=... test_acc=...`.
"""

import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torchvision
import torchvision.transforms as transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


if __name__ == "__main__":
    # the benchmark's repeats
    seed = int(sys.argv.pop(sys.argv.index("--seed") + 1)) if "--seed" in sys.argv else 0
    sys.argv = [a for a in sys.argv if a != "--seed"]
    root, epochs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
    trainset = torchvision.datasets.CIFAR10(root=root, train=True, download=True,
                                            transform=transform)
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=4, shuffle=True, num_workers=2)
    testset = torchvision.datasets.CIFAR10(root=root, train=False, download=True,
                                           transform=transform)
    testloader = torch.utils.data.DataLoader(testset, batch_size=4, shuffle=False, num_workers=2)
    net = Net().to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    start = time.perf_counter()
    for epoch in range(epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader, 0):
            inputs, labels = data[0].to(device), data[1].to(device)
            optimizer.zero_grad()
            loss = criterion(net(inputs), labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            if i % 2000 == 1999:
                print(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / 2000:.3f}", flush=True)
                running_loss = 0.0
    train_s = time.perf_counter() - start
    correct = total = 0
    with torch.no_grad():
        for images, labels in testloader:
            correct += (net(images.to(device)).argmax(1).cpu() == labels).sum().item()
            total += len(labels)
    print(f"RESULT tutorial_cnn epochs={epochs} train_s={train_s:.1f} "
          f"test_acc={correct / total:.4f}")
