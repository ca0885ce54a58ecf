"""The script's state outside ``end()``: one file per kind of state, behind one probe protocol
(``flor.watch.probe``).

=================  ==================================================================
``loop``           the epoch loop's own variables, noted at each epoch's end
``variables``      a block run's variables, the globals it declares, noted at end()
``attributes``     attributes of the script's own objects (noted) and of modules (named)
``reachable``      generators, containers, schedulers and scalers end() was not given
``outside``        in-place changes to the model made outside the blocks
``grads``          gradients a block run carries into the next
``names``          names a block binds that the code after end() reads
``plain``          the plain values these note, and their JSON form
``frames``         the script's frames: variables, ids given to end(), own objects
=================  ==================================================================
"""
