"""The memory page: a small web app served by memproxy at ``/ui/`` (app/api/ui.py), its files in
``static/`` inside the package. No build step and nothing from a CDN: it works offline."""
