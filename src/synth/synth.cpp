// placeholder: implemented by the synth work
