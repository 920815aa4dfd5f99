"""The window's style sheet (Qt CSS), by object name."""

STYLE = """
#sidebar { background: #F6F5F9; }
#sectionTitle { font-weight: 600; font-size: 13px; color: #333; }
#library { border: 1px solid #E0DDE8; border-radius: 6px; background: white; }
#library::item { padding: 4px 6px; border-bottom: 1px solid #F0EEF4; color: #222; }
#library::item:selected { background: #E6DDF5; color: #111; }
#gaugeTitle { font-weight: 600; color: #333; }
#gaugeLegend, #estimate { color: #444; font-size: 11px; }
#docHeader { border-bottom: 1px solid #E6E3EC; }
#docTitle { font-size: 16px; font-weight: 600; }
#docInfo { color: #555; }
#progressPanel { background: #F3F0FA; border-bottom: 1px solid #E0D8F0; }
#progressPanel QProgressBar { border: none; background: #E2DAF2; border-radius: 5px; }
#progressPanel QProgressBar::chunk { background: #8E5CC7; border-radius: 5px; }
#banner { border-bottom: 1px solid #DDD; }
#banner[kind="error"] { background: #FDECEA; color: #8A1C1C; }
#banner[kind="warning"] { background: #FFF6E0; color: #6B4E00; }
#banner[kind="info"] { background: #E8F1FB; color: #1D4E80; }
#dropArea { border: 2px dashed #C9C0DA; border-radius: 12px; margin: 24px; background: #FBFAFD; }
#dropArea[dragging="true"] { border-color: #8E5CC7; background: #F3EDFB; }
#dropTitle { font-size: 18px; font-weight: 600; color: #444; }
#dropHint { color: #666; }
QTextBrowser { border: none; background: white; }
#question { padding: 6px 8px; border: 1px solid #CFC8DC; border-radius: 6px; }
"""
