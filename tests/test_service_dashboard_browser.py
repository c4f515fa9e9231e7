"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, after a CPU worker graded two real submissions.

Skipped with the reason where Chromium, its driver or Selenium is absent; a failure instead where
``GRADER_BROWSER_REQUIRED=1`` (.ci/run installs them and sets it). Selenium is handed both paths,
so its manager downloads nothing. ``GRADER_DASHBOARD_SHOTS=DIR`` keeps the run page's screenshot
there (bench/results/dashboard-*/ holds one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from dashboard_helpers import DashboardServer
from grader_helpers import NAIVE, ci_config, make_workspace
from service_helpers import worker

from grader.service.archive import UploadLimits, check_upload
from grader.service.dashboard import COOKIE, NOT_TIMED
from grader.service.store import Store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REQUIRED = os.environ.get("GRADER_BROWSER_REQUIRED") == "1"
# How long a click's navigation may take: generous, as CI's 2 cores also run the suite's workers.
PAGE_WAIT_S = 60
# The failing submission: the naive control whose forward raises with markup in its message, so
# the grade's reasons (a submission's words) carry a script tag to the page.
SCRIPT = "<script>document.title='owned'</script>"
CRASHING = (
    "from naive_triton import DilatedResidualBlock as _Naive\n\n\n"
    "class DilatedResidualBlock(_Naive):\n"
    "    def forward(self, x):\n"
    f"        raise RuntimeError({SCRIPT!r})\n"
)


def _absent(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"{why}, and GRADER_BROWSER_REQUIRED=1 (CI installs chromium, "
                    "chromium-driver and selenium: .ci/run)")  # fmt: skip
    pytest.skip(why)


@pytest.fixture
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _absent("selenium is not installed (requirements-cpu.txt)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        _absent("no chromium or chromedriver on PATH (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    if os.geteuid() == 0:  # Chromium refuses root with its sandbox on (CI runs as root)
        options.add_argument("--no-sandbox")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _submit(store: Store, run: str, workspace: Path, note: str) -> int:
    """What the API does with an upload: `git archive`'s tar checked, stored, a grade queued."""
    tar = subprocess.run(["git", "-C", str(workspace), "archive", "--format=tar", "HEAD"],
                         capture_output=True, check=True).stdout  # fmt: skip
    tree = check_upload(tar, UploadLimits())
    assert tree.commit is not None
    sub, new = store.add_submission(run, commit=tree.commit, tree=tree.tree,
                                    archive=tree.archive, files=len(tree.files), note=note)
    assert new
    return sub.id


def _follow(browser, element) -> None:
    """Click what leads to another page, and return once that page has loaded.

    `click()` can return before the navigation it starts ends (a form's POST and its redirect, or
    a link), and Selenium's finds do not wait for it: on CI's loaded 2 cores a find once read the
    login page after the login's click. The old page's root going stale says a new document
    replaced it; its ready state says the new one is parsed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    old = browser.find_element(By.TAG_NAME, "html")
    element.click()
    wait = WebDriverWait(browser, PAGE_WAIT_S)
    wait.until(expected_conditions.staleness_of(old))
    wait.until(lambda b: b.execute_script("return document.readyState") == "complete")


def test_an_operator_reads_two_cpu_grades_in_a_browser(tmp_path: Path, browser) -> None:
    from selenium.webdriver.common.by import By

    store_dir = tmp_path / "store"
    config = ci_config(tmp_path / "scoring.yaml")
    naive = make_workspace(tmp_path / "naive", {"solution.py": NAIVE.read_text()})
    crashing = make_workspace(tmp_path / "crashing", {"naive_triton.py": NAIVE.read_text(),
                                                      "solution.py": CRASHING})  # fmt: skip
    with Store(store_dir) as store:
        run, _ = store.create_run("browser-run")
        passing = _submit(store, run.id, naive, "the naive control")
        failing = _submit(store, run.id, crashing, "raises with a script tag")
        operator = store.operator_token()
    w = worker(store_dir, "--cpu", "--once", "--config", str(config))
    _, err = w.communicate(timeout=900)
    assert w.returncode == 0, err

    with DashboardServer(store_dir) as server:
        base = f"{server.url}/dashboard"
        browser.get(f"{base}/")  # no session: the login form
        assert browser.find_element(By.ID, "error").text == "log in with the operator's token"
        browser.find_element(By.ID, "token").send_keys(operator)
        _follow(browser, browser.find_element(By.ID, "login"))
        # The runs page, through the form's cookie, which a page's script could not read.
        row = browser.find_element(By.ID, f"run-{run.id}")
        assert "browser-run" in row.text and "graded 2" in row.text, row.text
        cookie = browser.get_cookie(COOKIE)
        assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert browser.execute_script("return document.cookie") == ""

        _follow(browser, row.find_element(By.LINK_TEXT, "browser-run"))
        assert browser.current_url == f"{base}/runs/{run.id}"
        good = browser.find_element(By.ID, f"submission-{passing}")
        bad = browser.find_element(By.ID, f"submission-{failing}")
        assert "checked_untimed" in good.text and "the naive control" in good.text, good.text
        assert "crashed" in bad.text, bad.text
        assert browser.find_element(By.ID, "best").text.startswith("Best: none yet")
        assert browser.find_element(By.ID, "final").text.startswith("Final regrade: not requested")
        shot = tmp_path / "run-page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if os.environ.get("GRADER_DASHBOARD_SHOTS"):
            keep = Path(os.environ["GRADER_DASHBOARD_SHOTS"])
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, keep / "run-page.png")

        _follow(browser, bad.find_element(By.PARTIAL_LINK_TEXT, "grade"))
        assert browser.find_element(By.ID, "status").text == "crashed"
        reasons = browser.find_element(By.ID, "reasons").text
        # The tag is shown as text: the page's text holds it, the page holds no script element,
        # and the script did not run.
        assert f"the submission raised: RuntimeError: {SCRIPT}" in reasons, reasons
        assert browser.find_elements(By.TAG_NAME, "script") == []
        assert browser.title != "owned"
        assert browser.find_element(By.ID, "not-timed").text == NOT_TIMED

        browser.get(f"{base}/submissions/{passing}/report")
        assert browser.find_element(By.ID, "status").text == "checked_untimed"
        assert "nothing was timed" in browser.find_element(By.ID, "reasons").text
        assert browser.find_element(By.ID, "not-timed").text == NOT_TIMED
        assert "no GPU" in browser.find_element(By.ID, "not-checked").text

        _follow(browser, browser.find_element(By.ID, "logout"))
        assert browser.current_url == f"{base}/login"
        browser.get(f"{base}/runs/{run.id}")
        assert browser.find_elements(By.ID, f"submission-{passing}") == []
        assert browser.find_element(By.ID, "token").get_attribute("type") == "password"
