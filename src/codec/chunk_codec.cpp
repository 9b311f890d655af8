// placeholder: implemented by the codec work
