def keras_epochs(epochs: int = 3):
    """A small tf.keras fit with verbose=2 (prints 'Epoch y/z' lines); no progress code added."""
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    x = np.random.default_rng(hvd.rank()).normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=2 if hvd.rank() == 0 else 0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return hvd.rank()
