"""Glue between shardstream and the trainers people already use.

One small module per framework, each importing its framework only when it is imported
itself (``pip install 'shardstream[hf]'`` and so on), so the client stays light:

* :mod:`~shardstream.client.integrations.hf_trainer`: Hugging Face ``Trainer``
  (``ShardstreamTrainer``, or ``ShardstreamTrainerMixin`` for your own subclass);
* :mod:`~shardstream.client.integrations.hf_accelerate`: a bare ``accelerate`` loop;
* :mod:`~shardstream.client.integrations.composer`: MosaicML Composer
  (``composer_dataloader``).

Each one does the same three things and nothing more: it puts the loader's resume state
into the framework's own checkpoint, restores it from there without replaying any data
(the state is a position: O(1) whatever the step), and keeps shardstream's elastic resume
where the framework itself would replay, refuse a new world size, or drift. The shared
part, the data-state file beside a framework's checkpoint and its step check, lives in
:mod:`~shardstream.client.integrations.checkpoint_file`. ``shardstream.integrations`` is
the same modules under a shorter name.
"""
