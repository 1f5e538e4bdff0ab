"""The main job on real images: EASGD (p=4, tau=4, beta=0.9) vs pmean SGD.

Fashion-MNIST from Debian's dataset-fashion-mnist, the small CNN, local SGD with
heavy-ball momentum 0.9 (plain SGD at learning rate 0.1 reached only 88.2% after 14
of 15 epochs in our first run), mini-batch 128 per worker (the paper's), cosine
schedule over the run. Run:

    easgd compare --config experiments/fashion_mnist.py --workdir runs/fashion_mnist
"""

from easgd.settings.config import TrainConfig


def get_config() -> TrainConfig:
  return TrainConfig(
      dataset="fashion_mnist",  # 60000 train / 10000 test images, 28x28x1
      model="cnn",  # conv16-pool-conv32-pool-dense128
      num_workers=4,  # p
      global_batch_size=512,  # examples per step, all workers (128 per worker)
      num_epochs=15,  # passes over the training set
      learning_rate=0.05,  # peak eta, per local step
      lr_schedule="cosine",  # in epochs: decays to 0 at epoch 15
      optimizer="momentum",  # local heavy-ball SGD; its state stays per worker
      momentum=0.9,  # momentum coefficient (dimensionless)
      tau=4,  # communication period (local steps)
      beta=0.9,  # center moving rate; alpha = beta / p = 0.225
      seed=0,
  )
