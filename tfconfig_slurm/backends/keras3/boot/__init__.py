"""The folder with-tfconfig --keras3 puts first on its command's PYTHONPATH: sitecustomize.py."""
