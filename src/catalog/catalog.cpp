// placeholder: implemented by the catalog work
