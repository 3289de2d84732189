"""The names of the per-class metrics: TensorBoard tags of safe characters, one for each class,
and the class each one is, whose exact name the text beside them (`Dashboards`) and results.json
keep."""

import re
from collections import Counter

# What a part of a TensorBoard tag may not hold, as tf.summary cleans its names (letters, digits,
# '_', '-', '.'), '/' among them: Fashion-MNIST's "T-shirt/top" would be two levels of tags.
UNSAFE = re.compile(r"[^-\w.]")


def class_metrics(class_names: list[str], stage: str) -> dict[str, str]:
    """Each class's accuracy metric, `stage/acc_class/<tag>`, and the class's exact name. The tag is
    the name with each unsafe character as '_', and `_K`, its class's number, where two classes
    would share one ("a b" and "a_b")."""
    tags = [UNSAFE.sub("_", name) for name in class_names]
    shared = Counter(tags)
    metrics = {}
    for k, (tag, name) in enumerate(zip(tags, class_names)):
        if shared[tag] > 1:
            tag = f"{tag}_{k}"
        metrics[f"{stage}/acc_class/{tag}"] = name
    return metrics
